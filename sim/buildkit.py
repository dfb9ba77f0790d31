"""BuildKit as the Dockerfile builder where there is no Docker engine: buildkitd with its OCI worker on runc
(sim/go/buildkit, sim/go/runc), driven by buildctl.

One daemon at a time per machine (a lock file): its root in the cache keeps the build cache and snapshots between
builds; it runs only while something builds. Containers of RUN steps use the host's network (apt and PyPI) and a
cgroup under this process's own, never at a hierarchy root.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from gpuyard.sim.paths import cache_root
from gpuyard.sim.processes import Supervisor

READY_TIMEOUT_SECONDS = 60
# The Dockerfiles ask for the docker/dockerfile:1.7 frontend image (# syntax=), which cannot be pulled here.
# BuildKit's own Dockerfile frontend (v0.34, newer than 1.7) builds them itself when told the syntax line was
# resolved: moby/buildkit v0.34.2 frontend/dockerfile/builder/build.go forwards to that image only without "cmdline".
BUILTIN_FRONTEND = {"cmdline": "docker/dockerfile:1.7"}


class BuildFailed(RuntimeError):
    """A buildctl build or push failed; the message ends with the tail of its output."""


def root() -> Path:
    return cache_root() / "buildkit"


def cgroup_parent(name: str) -> str:
    """``name`` under this process's memory cgroup (cgroup v1: runc creates it in every hierarchy)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(",") or (controllers == "" and path != "/"):
            return f"{path.rstrip('/')}/{name}"
    return f"/{name}"


def daemon_config(socket: Path, runc: Path, insecure_registries: list[str], hub_mirror: str | None = None) -> str:
    """buildkitd.toml (moby/buildkit v0.34.2 cmd/buildkitd/config/config.go); ``hub_mirror`` answers for Docker
    Hub names (``docker.io``) first."""
    registries = "".join(f'\n[registry."{address}"]\n  http = true\n' for address in insecure_registries)
    if hub_mirror:
        registries += f'\n[registry."docker.io"]\n  mirrors = ["{hub_mirror}"]\n'
    return f"""root = "{root() / 'root'}"
[grpc]
  address = ["unix://{socket}"]
[worker.oci]
  enabled = true
  binary = "{runc}"
  snapshotter = "overlayfs"
  networkMode = "host"
  defaultCgroupParent = "{cgroup_parent('gpuyard-buildkit')}"
  gc = true
[worker.containerd]
  enabled = false
{registries}"""


@dataclass(frozen=True)
class Builder:
    """A buildkitd at ``socket`` (running, or the one ``running`` would start), driven by ``buildctl``; build logs
    and metadata under ``logs``."""

    buildctl: Path
    socket: Path
    logs: Path

    def command(self, dockerfile: Path, context: Path, *, output: str, target: str | None = None,
                build_args: dict[str, str] | None = None, named_contexts: dict[str, Path] | None = None,
                platform: str | None = None, metadata: Path | None = None) -> list[str]:
        """buildctl's command line: ``dockerfile`` with context ``context`` to ``output`` (buildctl's --output);
        ``named_contexts`` are local folders the Dockerfile names (``--mount=from=``)."""
        named = named_contexts or {}
        return [str(self.buildctl), "--addr", f"unix://{self.socket}", "build", "--progress", "plain",
                "--frontend", "dockerfile.v0", "--local", f"context={context}",
                "--local", f"dockerfile={dockerfile.parent}", "--opt", f"filename={dockerfile.name}",
                *(f"--opt={key}={value}" for key, value in BUILTIN_FRONTEND.items()),
                *(["--opt", f"target={target}"] if target else []),
                *(["--opt", f"platform={platform}"] if platform else []),
                *(f"--opt=build-arg:{key}={value}" for key, value in (build_args or {}).items()),
                *(arg for key, path in named.items() for arg in ("--local", f"{key}={path}",
                                                                 "--opt", f"context:{key}=local:{key}")),
                "--output", output, *(["--metadata-file", str(metadata)] if metadata else [])]

    def build(self, name: str, dockerfile: Path, context: Path, *, output: str, env: dict[str, str] | None = None,
              logged: bool = True, **options) -> dict:
        """Run ``command``; returns the build's metadata (``containerimage.digest`` among it). Its output goes to
        ``logs/<name>.log`` (a failure ends with the log's tail) or, with ``logged=False``, to this terminal."""
        metadata = self.logs / f"{name}.json"
        metadata.unlink(missing_ok=True)
        command = self.command(dockerfile, context, output=output, metadata=metadata, **options)
        environment = {**os.environ, **(env or {})}
        if not logged:
            if subprocess.run(command, stdin=subprocess.DEVNULL, env=environment).returncode != 0:
                raise BuildFailed(f"buildctl build of {name} failed (see the output above)")
            return json.loads(metadata.read_text())
        log = self.logs / f"{name}.log"
        with log.open("w") as out:
            out.write(" ".join(command) + "\n")
            out.flush()
            result = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    env=environment)
        if result.returncode != 0:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
            raise BuildFailed(f"buildctl build of {name} failed (log: {log}):\n{tail}")
        return json.loads(metadata.read_text())


def builder(bins: dict[str, Path]) -> Builder:
    """The Builder ``running`` starts (its socket and logs in the cache)."""
    run = root() / "run"
    return Builder(bins["buildkit"] / "buildctl", run / "buildkitd.sock", run / "logs")


@contextmanager
def running(bins: dict[str, Path], insecure_registries: list[str], say: Callable[[str], None] = print,
            hub_mirror: str | None = None) -> Iterator[Builder]:
    """buildkitd for as long as the block runs (waiting for another build's daemon to stop first)."""
    home = root()
    home.mkdir(parents=True, exist_ok=True)
    with (home / "lock").open("w") as lock:
        if _would_block(lock):
            say("waiting for another build's BuildKit to finish")
            fcntl.flock(lock, fcntl.LOCK_EX)
        ready = builder(bins)
        supervisor = Supervisor(ready.socket.parent)
        supervisor.state.mkdir(parents=True, exist_ok=True)
        config = supervisor.state / "buildkitd.toml"
        config.write_text(daemon_config(ready.socket, bins["runc"] / "runc", insecure_registries, hub_mirror))
        try:
            supervisor.start("buildkitd", [str(bins["buildkit"] / "buildkitd"), "--config", str(config)])
            _wait_ready(ready, supervisor)
            yield ready
        finally:
            supervisor.stop_all()


def _would_block(lock) -> bool:
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True


def _wait_ready(ready: Builder, supervisor: Supervisor) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    while True:
        supervisor.check("buildkitd")
        probe = subprocess.run([str(ready.buildctl), "--addr", f"unix://{ready.socket}", "debug", "workers"],
                               capture_output=True, text=True)
        if probe.returncode == 0 and probe.stdout.count("\n") >= 2:
            return
        if time.monotonic() > deadline:
            raise BuildFailed(f"buildkitd did not answer within {READY_TIMEOUT_SECONDS}s: {probe.stderr.strip()}")
        time.sleep(0.3)
