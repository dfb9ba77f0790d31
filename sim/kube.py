"""kubectl (built with the control plane) against one simulated cluster: server-side apply and JSON reads."""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import yaml

FIELD_MANAGER = "gpuyard-sim"
# what an API server answers when it is slow to answer, not a verdict on the request (k8s.io/apimachinery v0.35.4
# pkg/apis/meta/v1/types.go: StatusReasonTimeout, StatusReasonServerTimeout, StatusReasonServiceUnavailable; an
# etcd slower than its deadline comes back as an InternalError "etcdserver: request timed out"): a read is retried
BUSY_SERVER = ("Error from server (Timeout)", "Error from server (ServerTimeout)",
               "Error from server (ServiceUnavailable)", "etcdserver: request timed out", "TLS handshake timeout")
READ_ATTEMPTS = 4


class KubectlError(RuntimeError):
    """kubectl failed; the message is its stderr (the API server's or a webhook's reason)."""


@dataclass(frozen=True)
class Kubectl:
    binary: Path
    kubeconfig: Path

    def run(self, *args: str, stdin: str | None = None, timeout: float = 120) -> str:
        result = subprocess.run(
            [str(self.binary), f"--kubeconfig={self.kubeconfig}", *args],
            input=stdin, capture_output=True, text=True, timeout=timeout,
        )
        if result.returncode != 0:
            raise KubectlError(result.stderr.strip() or result.stdout.strip())
        return result.stdout

    def apply(self, objects: Iterable[dict[str, Any]], *, force_conflicts: bool = True) -> str:
        """Server-side apply of ``objects`` in one call (kubectl orders namespaces and CRDs first)."""
        text = yaml.dump_all(list(objects), Dumper=yaml.CSafeDumper, sort_keys=False)
        return self.apply_text(text, force_conflicts=force_conflicts)

    def apply_text(self, text: str, *, force_conflicts: bool = True) -> str:
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as handle:
            handle.write(text)
            handle.flush()
            return self.apply_files([Path(handle.name)], force_conflicts=force_conflicts)

    def apply_files(self, files: Iterable[Path], *, force_conflicts: bool = True) -> str:
        args = ["apply", "--server-side", f"--field-manager={FIELD_MANAGER}"]
        if force_conflicts:
            args.append("--force-conflicts")
        for path in files:
            args += ["-f", str(path)]
        return self.run(*args)

    def get(self, resource: str, name: str = "", namespace: str | None = None, selector: str = "") -> dict[str, Any]:
        args = ["get", resource, "-o", "json"]
        if name:
            args.insert(2, name)
        if namespace:
            args += ["-n", namespace]
        if selector:
            args += ["-l", selector]
        attempt = 1
        while True:
            try:
                return json.loads(self.run(*args))
            except KubectlError as error:
                if attempt == READ_ATTEMPTS or not any(busy in str(error) for busy in BUSY_SERVER):
                    raise
            time.sleep(2 * attempt)
            attempt += 1

    def items(self, resource: str, namespace: str | None = None, selector: str = "") -> list[dict[str, Any]]:
        return self.get(resource, namespace=namespace, selector=selector).get("items", [])
