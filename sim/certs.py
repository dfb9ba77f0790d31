"""A throwaway certificate authority for one simulated cluster: the API server's and every webhook's serving
certificate (valid for 127.0.0.1), the admin's client certificate and the service-account signing key."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_FOR = datetime.timedelta(days=365)


@dataclass(frozen=True)
class Pki:
    """Paths of the PEM files in a state folder's ``pki/``."""

    directory: Path

    @property
    def ca(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca.key"

    @property
    def serving_cert(self) -> Path:
        return self.directory / "serving.crt"

    @property
    def serving_key(self) -> Path:
        return self.directory / "serving.key"

    @property
    def admin_cert(self) -> Path:
        return self.directory / "admin.crt"

    @property
    def admin_key(self) -> Path:
        return self.directory / "admin.key"

    @property
    def service_account_key(self) -> Path:
        return self.directory / "service-account.key"

    @property
    def service_account_pub(self) -> Path:
        return self.directory / "service-account.pub"


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _write_key(path: Path, key: rsa.RSAPrivateKey) -> None:
    # PKCS#1 ("RSA PRIVATE KEY"): what cert-controller parses when it reuses a CA from a webhook Secret
    # (open-policy-agent/cert-controller pkg/rotator/rotator.go, x509.ParsePKCS1PrivateKey)
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attributes)


def _certificate(subject: x509.Name, key, issuer: x509.Name, issuer_key, *, ca: bool, usage=None, sans=None):
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject).issuer_name(issuer).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + VALID_FOR)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if usage:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write_cert(path: Path, certificate: x509.Certificate) -> None:
    path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))


def create(directory: Path, dns_names: tuple[str, ...] = (), ca_names: tuple[str, ...] = (),
           ip_addresses: tuple[str, ...] = ()) -> Pki:
    """A fresh CA and the certificates signed by it (idempotent: an existing ``pki/`` is kept); the serving
    certificate is also valid for ``dns_names`` (the in-cluster Service names operators check their certificate for)
    and ``ip_addresses`` (where pods reach the API server), the CA for ``ca_names`` (cert-controller checks a CA it
    reuses against the CA name it would give its own)."""
    pki = Pki(directory)
    if pki.service_account_pub.is_file():
        return pki
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_name = _key(), _name("gpuyard-sim-ca")
    _write_key(pki.ca_key, ca_key)
    ca_sans = [x509.DNSName(name) for name in ("gpuyard-sim-ca", *ca_names)]
    _write_cert(pki.ca, _certificate(ca_name, ca_key, ca_name, ca_key, ca=True, sans=ca_sans))
    serving_key = _key()
    sans = [*(x509.IPAddress(ipaddress.ip_address(a)) for a in ("127.0.0.1", *ip_addresses)), x509.DNSName("localhost"),
            *(x509.DNSName(name) for name in ("kubernetes.default.svc", *dns_names))]
    _write_key(pki.serving_key, serving_key)
    _write_cert(pki.serving_cert, _certificate(_name("127.0.0.1"), serving_key, ca_name, ca_key, ca=False,
                                               usage=[ExtendedKeyUsageOID.SERVER_AUTH], sans=sans))
    # system:masters: the admin kubeconfig every component of the simulation uses
    admin_key = _key()
    _write_key(pki.admin_key, admin_key)
    _write_cert(pki.admin_cert, _certificate(_name("gpuyard-sim-admin", "system:masters"), admin_key, ca_name, ca_key,
                                             ca=False, usage=[ExtendedKeyUsageOID.CLIENT_AUTH]))
    account_key = _key()
    _write_key(pki.service_account_key, account_key)
    pki.service_account_pub.write_bytes(account_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return pki


def client(pki: Pki, stem: str, common_name: str, organization: str) -> tuple[Path, Path]:
    """A client certificate and key (``pki/<stem>.crt``, ``.key``) for ``common_name`` in group ``organization``,
    signed by the cluster's CA: a kubelet's is ``system:node:<name>`` in ``system:nodes`` (the Node authorizer)."""
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    ca_name = x509.load_pem_x509_certificate(pki.ca.read_bytes()).subject
    key = _key()
    cert_path, key_path = pki.directory / f"{stem}.crt", pki.directory / f"{stem}.key"
    _write_key(key_path, key)
    _write_cert(cert_path, _certificate(_name(common_name, organization), key, ca_name, ca_key, ca=False,
                                        usage=[ExtendedKeyUsageOID.CLIENT_AUTH]))
    return cert_path, key_path
