"""Containers of the pushed images, run with runc as a node's runtime runs them.

The image is read from the registry (manifest, config, layers); each layer is unpacked once into the cache
(``layers/<digest>``, OCI whiteouts turned into overlayfs ones, as containerd's overlay snapshotter does) and a
container's root is an overlay of them with a fresh upper folder. Its OCI runtime config starts from ``runc spec``
and takes the image config's user, environment, working directory, entrypoint and command, then what a test adds
(bind mounts, environment, arguments). Containers share the host's network (their servers listen on loopback) and
have their own PID, mount, IPC and UTS namespaces, so the image's entrypoint is PID 1 and the kubelet's stop,
SIGTERM to PID 1 (``runc kill``), is what a test sends.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from gpuyard.sim.buildkit import cgroup_parent
from gpuyard.sim.paths import bin_dir, cache_root
from gpuyard.sim.versions import IMAGE_COMPONENTS

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"


def runc() -> Path:
    component = next(c for c in IMAGE_COMPONENTS if c.name == "runc")
    return bin_dir(component.name, component.version) / "runc"


@dataclass(frozen=True)
class Image:
    """An image in a registry at ``address``: its config and its layers (digest, gzipped), bottom first."""

    address: str
    repository: str
    config: dict
    layers: tuple[tuple[str, bool], ...]

    @classmethod
    def pull(cls, reference: str) -> Image:
        """Read ``host:port/repository:tag``'s manifest and config (a linux/amd64 manifest of an index)."""
        address, _, rest = reference.partition("/")
        repository, _, tag = rest.rpartition(":")
        manifest = _get_json(address, f"{repository}/manifests/{tag}", f"{OCI_INDEX}, {OCI_MANIFEST}")
        if manifest.get("mediaType") == OCI_INDEX:
            chosen = next(m for m in manifest["manifests"]
                          if m.get("platform", {}).get("architecture") == "amd64")
            manifest = _get_json(address, f"{repository}/manifests/{chosen['digest']}", OCI_MANIFEST)
        config = _get_json(address, f"{repository}/blobs/{manifest['config']['digest']}", "*/*")
        return cls(address, repository, config, tuple((layer["digest"], layer["mediaType"].endswith("gzip"))
                                                      for layer in manifest["layers"]))

    def unpacked_layers(self) -> list[Path]:
        return [unpack_layer(self.address, self.repository, digest, gzipped) for digest, gzipped in self.layers]


def _get_json(address: str, path: str, accept: str) -> dict:
    request = urllib.request.Request(f"http://{address}/v2/{path}", headers={"Accept": accept})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)


def unpack_layer(address: str, repository: str, digest: str, gzipped: bool) -> Path:
    """The layer ``digest`` unpacked into the cache (once), its whiteouts made overlayfs ones."""
    target = cache_root() / "layers" / digest.replace(":", "-")
    if target.is_dir():
        return target
    # a staging folder of this process's own: both test workers may unpack the same layer at once
    staging = target.with_name(f"{target.name}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    with urllib.request.urlopen(f"http://{address}/v2/{repository}/blobs/{digest}", timeout=60) as blob:
        tar = subprocess.Popen(["tar", "-x", *(["-z"] if gzipped else []), "--numeric-owner", "--xattrs",
                                "--xattrs-include=*", "-C", str(staging)],
                               stdin=subprocess.PIPE)
        shutil.copyfileobj(blob, tar.stdin, 1 << 20)
        tar.stdin.close()
        if tar.wait() != 0:
            raise RuntimeError(f"unpacking layer {digest} failed")
    for folder, dirs, files in os.walk(staging):
        for name in files:
            if name == OPAQUE:
                os.remove(os.path.join(folder, name))
                os.setxattr(folder, "trusted.overlay.opaque", b"y")
            elif name.startswith(WHITEOUT):
                os.remove(os.path.join(folder, name))
                os.mknod(os.path.join(folder, name[len(WHITEOUT):]), 0o600 | 0o020000, os.makedev(0, 0))
    try:
        staging.rename(target)
    except OSError:  # the other worker's copy came first (rename onto a non-empty folder fails)
        if not target.is_dir():
            raise
        shutil.rmtree(staging)
    return target


@dataclass
class Container:
    """One runc container from ``image``: ``process`` overrides (args, env, user), extra bind ``mounts``."""

    image: Image
    name: str
    folder: Path
    args: list[str] | None = None
    env: dict[str, str] = field(default_factory=dict)
    mounts: dict[str, Path] = field(default_factory=dict)  # container path -> host path (read-only binds)
    hosts: dict[str, str] = field(default_factory=dict)  # /etc/hosts, as the kubelet writes it: name -> address
    process: subprocess.Popen | None = None

    @property
    def state(self) -> Path:
        return self.folder / "runc"

    def runtime_config(self) -> dict:
        subprocess.run([str(runc()), "spec", "--bundle", str(self.folder)], check=True)
        spec = json.loads((self.folder / "config.json").read_text())
        image = self.image.config["config"]
        uid, _, gid = image.get("User", "0:0").partition(":")
        process = spec["process"]
        process.update(terminal=False, cwd=image.get("WorkingDir") or "/",
                       user={"uid": int(uid), "gid": int(gid or uid)},
                       args=self.args if self.args is not None else image.get("Entrypoint", []) + image.get("Cmd", []))
        env = dict(item.split("=", 1) for item in image.get("Env", []))
        process["env"] = [f"{key}={value}" for key, value in {**env, **self.env}.items()]
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # a container may not raise the host's
        process["rlimits"] = [{"type": "RLIMIT_NOFILE", "hard": hard, "soft": hard}]
        spec["root"] = {"path": "rootfs", "readonly": False}
        spec["hostname"] = self.name
        linux = spec["linux"]
        linux["namespaces"] = [ns for ns in linux["namespaces"] if ns["type"] != "network"]  # the host's network
        # the test worker's pid in the cgroup's name: two workers may each run a container of the same name
        linux["cgroupsPath"] = f"{cgroup_parent('gpuyard-test-containers')}/{self.name}-{os.getpid()}"
        spec["mounts"] = [m for m in spec["mounts"] if m["destination"] != "/dev/shm"] + [
            {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
             "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=268435456"]},
            *({"destination": target, "type": "bind", "source": str(source), "options": ["rbind", "ro"]}
              for target, source in {**self.mounts, "/etc/hosts": self.folder / "hosts"}.items()),
        ]
        return spec

    def start(self, output: Path) -> subprocess.Popen:
        """Mount the root, write the bundle, ``runc run`` in the foreground (its output to ``output``)."""
        rootfs, upper, work = (self.folder / name for name in ("rootfs", "upper", "work"))
        for path in (rootfs, upper, work, self.state):
            path.mkdir(parents=True, exist_ok=True)
        # top first; a layer repeated (the empty one of WORKDIR or ENV, say) only where it is highest: overlayfs
        # takes no folder twice, and the higher copy hides whatever the lower one gave
        lower = ":".join(dict.fromkeys(str(layer) for layer in reversed(self.image.unpacked_layers())))
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o", f"lowerdir={lower},upperdir={upper},workdir={work}",
                        str(rootfs)], check=True)
        hosts = {"localhost": "127.0.0.1", self.name: "127.0.0.1", **self.hosts}
        (self.folder / "hosts").write_text("".join(f"{address}\t{name}\n" for name, address in hosts.items()))
        (self.folder / "config.json").write_text(json.dumps(self.runtime_config(), indent=1))
        with output.open("w") as out:
            self.process = subprocess.Popen([str(runc()), "--root", str(self.state), "run", "--bundle", str(self.folder),
                                             self.name], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        return self.process

    def pid1(self) -> int | None:
        """The host pid of the container's PID 1 (None before it started or after it exited)."""
        state = subprocess.run([str(runc()), "--root", str(self.state), "state", self.name], capture_output=True,
                               text=True)
        return json.loads(state.stdout)["pid"] if state.returncode == 0 else None

    def pid1_command(self) -> str | None:
        """What runs as the container's PID 1 (its /proc comm)."""
        pid = self.pid1()
        return Path(f"/proc/{pid}/comm").read_text().strip() if pid else None

    def kill(self, signal: str = "TERM") -> None:
        """What the kubelet's stop does first: the signal to the container's PID 1."""
        subprocess.run([str(runc()), "--root", str(self.state), "kill", self.name, signal], check=True)

    def wait(self, timeout: float) -> int:
        return self.process.wait(timeout=timeout)

    def remove(self) -> None:
        """Kill whatever still runs, delete the container and unmount its root."""
        if self.process and self.process.poll() is None:
            subprocess.run([str(runc()), "--root", str(self.state), "kill", "--all", self.name, "KILL"],
                           capture_output=True)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
        subprocess.run([str(runc()), "--root", str(self.state), "delete", "--force", self.name], capture_output=True)
        subprocess.run(["umount", str(self.folder / "rootfs")], capture_output=True)


@contextmanager
def container(image: Image, name: str, folder: Path, output: Path, **options) -> Iterator[Container]:
    """A started container, removed (killed, deleted, unmounted) when the block ends."""
    run = Container(image, name, folder, **options)
    try:
        run.start(output)
        yield run
    finally:
        run.remove()


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.2)
