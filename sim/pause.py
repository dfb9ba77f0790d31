"""The pod sandbox ("pause") image of the real nodes, pushed to the sim's registry: the public one
(registry.k8s.io/pause) cannot be pulled here. Its one layer is Debian's busybox-static (`apt-get download`, cached),
its entrypoint `busybox sleep`: a sandbox's process only holds the pod's namespaces until containerd kills it.
The same image, with the applets of APPLETS linked in /bin, stands in for the PyTorchJob workers' init container
image (alpine:3.10 upstream: sim/addons.py training_operator_args), which runs `sh -c` with `seq` and `nslookup`.
Its `nslookup` is NSLOOKUP: busybox 1.35's nslookup exits 1 for a short name when any name of the search path is
NXDOMAIN, even when another one answered (measured in a pod: `nslookup gang-master-0` 1, the full name 0), so
upstream's loop would wait for a master that resolves; NSLOOKUP prints busybox's answer and succeeds when it holds
an answer record (busybox prints those as ``Name:``). Its `sh` is gosh (gpuyard.sim.versions.INIT_SHELL): busybox's own sh
runs its nslookup applet for a bare `nslookup`, whatever /bin holds.
"""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

from gpuyard.sim.paths import built, cache_root
from gpuyard.sim.registry import Registry
from gpuyard.sim.versions import INIT_SHELL

REPOSITORY = "gpuyard-sim/pause"
PACKAGE = "busybox-static"
ENTRYPOINT = ["/bin/busybox", "sleep", "2147483647"]
APPLETS = ("seq", "sleep", "cat", "grep")  # infra/manifests/training-operator/pytorch-init-container.yaml
NSLOOKUP = b"""#!/bin/busybox sh
answer=$(/bin/busybox nslookup "$@" 2>&1)
echo "$answer"
echo "$answer" | /bin/busybox grep -q '^Name:'
"""


def fetch() -> Path:
    """Debian's busybox-static package, downloaded once into the cache (`python -m gpuyard.sim.build` does it, outside
    any network namespace a test runs in)."""
    folder = cache_root() / "pause"
    folder.mkdir(parents=True, exist_ok=True)
    debs = sorted(folder.glob(f"{PACKAGE}_*.deb"))
    if not debs:
        result = subprocess.run(["apt-get", "download", PACKAGE], cwd=folder, capture_output=True, text=True)
        debs = sorted(folder.glob(f"{PACKAGE}_*.deb"))
        if not debs:
            raise RuntimeError(f"apt-get download {PACKAGE} failed: {result.stderr.strip()}")
    return debs[-1]


def _busybox() -> bytes:
    tree = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(fetch())], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tree)) as archive:
        return archive.extractfile("./bin/busybox").read()


def _shell() -> bytes:
    folder = built(INIT_SHELL)
    if folder is None:
        raise RuntimeError(f"{INIT_SHELL.name} {INIT_SHELL.version} is not built (python -m gpuyard.sim.build dev realnode)")
    return (folder / "gosh").read_bytes()


def _layer(busybox: bytes, shell: bytes) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        folder = tarfile.TarInfo("bin")
        folder.type, folder.mode = tarfile.DIRTYPE, 0o755
        archive.addfile(folder)
        _add_executable(archive, "bin/busybox", busybox)
        for applet in APPLETS:
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname, link.mode = tarfile.SYMTYPE, "busybox", 0o777
            archive.addfile(link)
        _add_executable(archive, "bin/nslookup", NSLOOKUP)
        _add_executable(archive, "bin/sh", shell)
    return buffer.getvalue()


def _add_executable(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    member = tarfile.TarInfo(name)
    member.size, member.mode = len(data), 0o755
    archive.addfile(member, io.BytesIO(data))


def push(registry: Registry) -> str:
    """Push the pause image (unless it is there); returns its reference."""
    return registry.push(REPOSITORY, _layer(_busybox(), _shell()), {"Entrypoint": ENTRYPOINT})
