"""Admission webhooks served on 127.0.0.1: upstream's webhook configurations with each ``service`` reference
replaced by a URL to the local server and the simulation's CA as ``caBundle``."""

from __future__ import annotations

import base64
import copy
import socket
import time
from pathlib import Path
from typing import Any

WEBHOOK_KINDS = ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration")


def served_locally(configuration: dict[str, Any], port: int, ca: Path) -> dict[str, Any]:
    """``configuration`` calling https://127.0.0.1:``port``<path> instead of its in-cluster Service."""
    local = copy.deepcopy(configuration)
    bundle = base64.b64encode(ca.read_bytes()).decode()
    for webhook in local.get("webhooks", []):
        path = webhook["clientConfig"].get("service", {}).get("path", "/")
        webhook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": bundle}
    local["metadata"].pop("annotations", None)  # cert-manager's inject-ca-from: the bundle is already there
    return local


def wait_listening(port: int, timeout: float, check=lambda: None, host: str = "127.0.0.1") -> None:
    """Wait until something accepts connections on ``host``:``port``; ``check`` raises if its server died."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            check()
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing listens on {host}:{port} after {timeout:.0f}s") from None
            time.sleep(0.3)
