"""Long-running servers of one simulated cluster: each in its own process group, recorded in the state folder so a
later `gpuyard sim down` (another process) stops them, logs under ``logs/``."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpuyard.infra.signals import signals_deferred

PIDS = "pids.json"
STOP_GRACE_SECONDS = 10
KILL_WAIT_SECONDS = 5


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class Supervisor:
    """Starts and stops the servers of the state folder ``state``."""

    state: Path

    @property
    def logs(self) -> Path:
        return self.state / "logs"

    def pids(self) -> dict[str, int]:
        path = self.state / PIDS
        return json.loads(path.read_text()) if path.is_file() else {}

    def running(self) -> dict[str, int]:
        return {name: pid for name, pid in self.pids().items() if alive(pid)}

    def _record(self, pids: dict[str, int]) -> None:
        (self.state / PIDS).write_text(json.dumps(pids, indent=1) + "\n")

    def start(self, name: str, command: list[str], env: dict[str, str] | None = None) -> int:
        """Start ``command`` in a new session (its own process group), output to ``logs/<name>.log``."""
        self.logs.mkdir(parents=True, exist_ok=True)
        with open(self.logs / f"{name}.log", "ab") as log:
            process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=self.state,
                env={**os.environ, **(env or {})}, start_new_session=True,
            )
        self._record({**self.pids(), name: process.pid})
        return process.pid

    def check(self, name: str) -> None:
        """Raise with the tail of its log if the server ``name`` has exited."""
        pid = self.pids().get(name)
        if pid is None or not alive(pid) or zombie(pid):
            tail = "\n".join((self.logs / f"{name}.log").read_text(errors="replace").splitlines()[-20:])
            raise RuntimeError(f"{name} exited; the end of {self.logs / (name + '.log')}:\n{tail}")

    def wait_until(self, name: str, ready: Callable[[], bool], timeout: float, what: str) -> None:
        """Poll ``ready`` until it is true; raise if the server ``name`` exits first, or after ``timeout`` seconds
        (``what`` did not answer)."""
        deadline = time.monotonic() + timeout
        while not ready():
            self.check(name)
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not answer within {timeout:.0f}s (see {self.logs / (name + '.log')})")
            time.sleep(0.2)

    def stop_all(self) -> None:
        """SIGTERM every recorded process group (newest first), SIGKILL what outlives the grace period.

        A second Ctrl-C or SIGTERM waits until this is done (it is held back, then delivered), so it cannot leave a
        server running."""
        pids = self.pids()
        with signals_deferred():
            for pid in reversed(list(pids.values())):
                _signal_group(pid, signal.SIGTERM)
            _wait_gone(pids.values(), STOP_GRACE_SECONDS)
            for pid in pids.values():
                _signal_group(pid, signal.SIGKILL)
            _wait_gone(pids.values(), KILL_WAIT_SECONDS)  # a killed process still exits: return once it has
            (self.state / PIDS).unlink(missing_ok=True)


def zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except (FileNotFoundError, IndexError):
        return False


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return not zombie(pid)


def _wait_gone(pids, seconds: float) -> None:
    """Reap and wait until no process group of ``pids`` lives (zombies of other parents aside), ``seconds`` at most."""
    deadline = time.monotonic() + seconds
    while True:
        _reap(pids)
        if not any(_group_alive(pid) for pid in pids) or time.monotonic() >= deadline:
            return
        time.sleep(0.1)


def _reap(pids) -> None:
    """Collect exit statuses of our own children (other processes' children are reaped by their parent or init)."""
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
