"""The image registry of the simulated cluster: CNCF distribution's ``registry`` (sim/go/registry), plain HTTP.

Its storage lives in the cache (``registry/``), outside any cluster's state folder, so pushed images outlive
``gpuyard sim down`` and one registry serves every stack. The listen address is a parameter: 127.0.0.1 by default, the
sim's bridge address when real nodes pull from it. ``registry.json`` in the state folder records where it listens.
"""

from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import yaml

from gpuyard.infra.config import StackConfig
from gpuyard.sim.paths import cache_root
from gpuyard.sim.processes import Supervisor, free_port

NAME = "registry"  # the supervisor's name for it, and its binary's
RECORD = "registry.json"
READY_TIMEOUT_SECONDS = 30
# OCI image index and manifest, and Docker's: what BuildKit pushes and what a HEAD must accept to find it.
MANIFEST_TYPES = ("application/vnd.oci.image.index.v1+json", "application/vnd.oci.image.manifest.v1+json",
                  "application/vnd.docker.distribution.manifest.v2+json",
                  "application/vnd.docker.distribution.manifest.list.v2+json")


def storage_dir() -> Path:
    return cache_root() / "registry"


@dataclass(frozen=True)
class Registry:
    """A running registry at ``address`` (host:port), spoken to over plain HTTP."""

    address: str

    def prefix(self, config: StackConfig) -> str:
        """The stack's image prefix here, shaped like its ECR one (``<host>/<cluster name>``)."""
        return f"{self.address}/{config.cluster_name}"

    def manifest(self, repository: str, reference: str) -> tuple[str, bytes] | None:
        """(media type, bytes) of ``repository:reference``, None when the registry has no such manifest."""
        request = urllib.request.Request(f"http://{self.address}/v2/{repository}/manifests/{reference}",
                                         headers={"Accept": ", ".join(MANIFEST_TYPES)})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.headers["Content-Type"], response.read()
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return None
            raise

    def tag(self, repository: str, source: str, tag: str) -> None:
        """Point ``tag`` at the manifest ``source`` names (the Distribution API's manifest PUT)."""
        found = self.manifest(repository, source)
        if found is None:
            raise RuntimeError(f"{self.address}/{repository}:{source} is not in the registry")
        media_type, body = found
        request = urllib.request.Request(f"http://{self.address}/v2/{repository}/manifests/{tag}", data=body,
                                         method="PUT", headers={"Content-Type": media_type})
        urllib.request.urlopen(request, timeout=30).close()

    def push(self, repository: str, layer: bytes, image_config: dict) -> str:
        """Push a one-layer image (an uncompressed tar) with ``image_config`` (the OCI config's ``config``) unless its
        tag (``in-`` and the digest of both) is there; returns its reference."""
        config = json.dumps({"architecture": "amd64", "os": "linux", "config": image_config,
                             "rootfs": {"type": "layers", "diff_ids": [_digest(layer)]}}).encode()
        tag = "in-" + hashlib.sha256(layer + config).hexdigest()[:20]
        reference = f"{self.address}/{repository}:{tag}"
        if self.manifest(repository, tag) is not None:
            return reference
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **self._blob(repository, config)},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", **self._blob(repository, layer)}],
        }).encode()
        request = urllib.request.Request(f"http://{self.address}/v2/{repository}/manifests/{tag}", data=manifest,
                                         method="PUT",
                                         headers={"Content-Type": "application/vnd.oci.image.manifest.v1+json"})
        urllib.request.urlopen(request, timeout=30).close()
        return reference

    def _blob(self, repository: str, data: bytes) -> dict:
        """The OCI distribution spec's monolithic upload (POST, then PUT with the digest)."""
        digest = _digest(data)
        start = urllib.request.Request(f"http://{self.address}/v2/{repository}/blobs/uploads/", method="POST")
        with urllib.request.urlopen(start, timeout=30) as response:
            location = response.headers["Location"]
        if location.startswith("/"):
            location = f"http://{self.address}{location}"
        separator = "&" if "?" in location else "?"
        upload = urllib.request.Request(f"{location}{separator}digest={digest}", data=data, method="PUT",
                                        headers={"Content-Type": "application/octet-stream"})
        urllib.request.urlopen(upload, timeout=60).close()
        return {"digest": digest, "size": len(data)}

    def ready(self) -> bool:
        try:
            urllib.request.urlopen(f"http://{self.address}/v2/", timeout=2).close()
            return True
        except OSError:
            return False


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def config_document(listen: str, storage: Path) -> dict:
    """distribution v3.1's configuration (docs/content/about/configuration.md): filesystem storage, no auth."""
    return {
        "version": 0.1,
        "log": {"level": "warn", "formatter": "text", "accesslog": {"disabled": True}},
        "storage": {"filesystem": {"rootdirectory": str(storage)}, "delete": {"enabled": True}},
        "http": {"addr": listen},
    }


def start(supervisor: Supervisor, binary: Path, host: str = "127.0.0.1", port: int | None = None) -> Registry:
    """Start the registry under ``supervisor`` on ``host`` (a free port unless given); returns once it answers."""
    address = f"{host}:{port or free_port()}"
    storage = storage_dir()
    storage.mkdir(parents=True, exist_ok=True)
    supervisor.state.mkdir(parents=True, exist_ok=True)
    config = supervisor.state / "registry.yaml"
    config.write_text(yaml.safe_dump(config_document(address, storage)))
    # v3 exports traces through OpenTelemetry's environment; nothing here collects them
    supervisor.start(NAME, [str(binary), "serve", str(config)], env={"OTEL_TRACES_EXPORTER": "none"})
    registry = Registry(address)
    supervisor.wait_until(NAME, registry.ready, READY_TIMEOUT_SECONDS, f"the registry on {address}")
    (supervisor.state / RECORD).write_text(json.dumps({"address": address}) + "\n")
    return registry


def recorded(state: Path) -> Registry | None:
    """The registry a state folder's ``start`` recorded, if any."""
    path = state / RECORD
    return Registry(json.loads(path.read_text())["address"]) if path.is_file() else None


@contextmanager
def serving(state: Path, binary: Path, host: str = "127.0.0.1") -> Iterator[Registry]:
    """A registry of its own (state folder ``state``) for as long as the block runs: builds outside a cluster."""
    supervisor = Supervisor(state)
    try:
        yield start(supervisor, binary, host)
    finally:
        supervisor.stop_all()
