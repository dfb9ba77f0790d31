"""Helpers for the trainer tests: launch commands, reading the done line, a faulty TCP proxy."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

from gpuyard.jobs.local_aws import free_port
from gpuyard.jobs.processes import descendants
from gpuyard.jobs.workload.args import RAY_MODULE, TRAIN_MODULE, TrainArgs

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parent.parent


def pythonpath() -> str:
    """The checkout first, then the caller's PYTHONPATH (a worktree run's mapping of ``gpuyard`` to its folders)."""
    return os.pathsep.join(path for path in (str(REPO), os.environ.get("PYTHONPATH", "")) if path)


def python_cmd(args: TrainArgs) -> list[str]:
    return [sys.executable, "-m", TRAIN_MODULE, *args.to_argv()]


def torchrun_cmd(args: TrainArgs, nproc: int = 2, max_restarts: int = 0) -> list[str]:
    """Static rendezvous: the agent makes a fresh store for every restart, so no stale gloo addresses."""
    return [str(BIN / "torchrun"), "--nproc-per-node", str(nproc), "--max-restarts", str(max_restarts),
            "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
            "-m", TRAIN_MODULE, *args.to_argv()]


def mpirun_cmd(args: TrainArgs, nproc: int = 2, sigkill_timeout: int = 1) -> list[str]:
    """``sigkill_timeout``: Open MPI 4 sends SIGTERM that long after mpirun's, then SIGKILL as long after it."""
    return ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(nproc),
            "--mca", "odls_base_sigkill_timeout", str(sigkill_timeout),
            "-x", "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={free_port()}", "-x", "TTY_INTERACTIVE=0",
            "-x", "PATH", "-x", "PYTHONPATH", sys.executable, "-m", TRAIN_MODULE, *args.to_argv()]


def ray_cmd(args: TrainArgs, workers: int = 2) -> list[str]:
    return [sys.executable, "-m", RAY_MODULE, *args.to_argv(), "--num-workers", str(workers)]


def run(cmd: list[str], env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """``cmd`` to its end in its own session; past ``timeout`` the whole session is killed, not only the launcher
    (subprocess.run's kill left a hung torchrun rank running for the rest of a CI run)."""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                          start_new_session=True, env={**os.environ, "PYTHONPATH": pythonpath(), **(env or {})}) as job:
        try:
            stdout, stderr = job.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            raise
    return subprocess.CompletedProcess(cmd, job.returncode, stdout, stderr)


def start(cmd: list[str], out: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """A launcher in its own session, stdout and stderr to ``out``."""
    return subprocess.Popen(cmd, stdout=out.open("w"), stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": pythonpath(), **(env or {})})


def wait_for(condition, timeout: float = 90, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def finished(process: subprocess.Popen, out: Path, timeout: float = 180) -> subprocess.CompletedProcess:
    """Wait for a launcher started by ``start``; a hung one is killed with its whole session."""
    try:
        process.wait(timeout=timeout)
    finally:
        if process.poll() is None:
            kill_tree(process.pid)
    return subprocess.CompletedProcess(process.args, process.returncode, out.read_text(), "")


def events(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def done_event(result: subprocess.CompletedProcess) -> dict:
    """The single ``done`` line of a finished run (fails loudly with the run's stderr otherwise)."""
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    done = [event for event in events(result.stdout) if event["event"] == "done"]
    assert len(done) == 1, result.stdout
    return done[0]


def trained(done: dict) -> dict:
    """What training produced (epochs, steps, weights), without where it was saved."""
    return {key: value for key, value in done.items() if key != "checkpoint"}


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid``'s process group and every descendant's: the supervisor's mpirun has a session of its own, each
    of Open MPI's ranks a process group of its own (odls_default_module.c ``setpgid(0, 0)``)."""
    for each in [pid, *descendants(pid)]:
        try:
            os.killpg(each, signal.SIGKILL)
        except OSError:
            pass
        try:
            os.kill(each, signal.SIGKILL)
        except OSError:
            pass


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(child) for child in (task / "children").read_text().split()]
    return found


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


class FaultyProxy:
    """A TCP proxy on 127.0.0.1 in front of a server, with real network faults.

    ``down()`` resets every connection and refuses new ones until ``up()``; ``hold(pattern)`` stops
    forwarding a connection once a client sends bytes matching the regular expression ``pattern`` (``held`` is
    then set, ``held_request`` is those bytes);
    ``cut_after(pattern)`` forwards that request, drops the server's reply and goes ``down()``: the
    request has landed, the client sees a reset and retries in vain (``cut`` is then set);
    ``fail(pattern, nth)`` answers the ``nth`` request containing ``pattern`` with an S3 error itself and
    never forwards it (``failed_request`` is then its bytes); ``delay(pattern)`` holds the next such
    request until ``release()``, then forwards it (``delayed`` is set while it waits). ``requests``
    lists (request line, Content-Length) of every request forwarded; ``served`` counts the bytes the server sent.
    """

    def __init__(self, target_port: int):
        self.target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._down = threading.Event()
        self._pattern: re.Pattern[bytes] | None = None
        self.held_request: bytes | None = None
        self._cut_pattern: bytes | None = None
        self._fail: tuple[bytes, int, int, str] | None = None
        self._delay_pattern: bytes | None = None
        self.held, self.cut, self.delayed, self._released = (threading.Event(), threading.Event(),
                                                             threading.Event(), threading.Event())
        self.failed_request: bytes | None = None
        self.requests: list[tuple[str, int]] = []
        self.served = 0
        self._connections: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def down(self) -> None:
        self._down.set()
        with self._lock:
            for connection in self._connections:
                _reset(connection)
            self._connections.clear()

    def up(self) -> None:
        self._down.clear()

    def hold(self, pattern: bytes) -> None:
        self._pattern = re.compile(pattern)

    def cut_after(self, pattern: bytes) -> None:
        self._cut_pattern = pattern

    def fail(self, pattern: bytes, nth: int = 1, status: int = 403, code: str = "AccessDenied") -> None:
        self._fail = (pattern, nth, status, code)

    def delay(self, pattern: bytes) -> None:
        self._delay_pattern = pattern

    def release(self) -> None:
        self._released.set()

    def close(self) -> None:
        self.release()
        self.down()
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._down.is_set():
                _reset(client)
                continue
            server = socket.create_connection(("127.0.0.1", self.target_port))
            with self._lock:
                self._connections += [client, server]
            marked = threading.Event()  # this connection carries the request to cut after
            answered = threading.Event()  # the proxy answered this connection's request itself
            threading.Thread(target=self._pump, args=(client, server, True, marked, answered), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False, marked, answered), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, from_client: bool, marked: threading.Event,
              answered: threading.Event) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if from_client and self._pattern and self._pattern.search(data):
                    self.held_request = data
                    self.held.set()
                    return  # never forwarded: the client waits until it gives up or dies
                if from_client and self._answered_with_error(data, source):
                    answered.set()
                    return
                if from_client and self._delay_pattern and self._delay_pattern in data:
                    self._delay_pattern = None
                    self.delayed.set()
                    self._released.wait()
                if from_client and self._cut_pattern and self._cut_pattern in data:
                    self._cut_pattern = None
                    marked.set()
                if not from_client and marked.is_set() and not data.startswith(b"HTTP/1.1 100 "):
                    self.cut.set()  # the server has answered, so the request landed: the client never hears it
                    self.down()
                    return
                if from_client:
                    self._log(data)
                else:
                    with self._lock:
                        self.served += len(data)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            if answered.is_set():
                (sink if from_client else source).close()
            elif not (from_client and self.held.is_set()):
                _reset(sink)

    def _answered_with_error(self, data: bytes, client: socket.socket) -> bool:
        if not self._fail or self._fail[0] not in data:
            return False
        pattern, nth, status, code = self._fail
        if nth > 1:
            self._fail = (pattern, nth - 1, status, code)
            return False
        self._fail, self.failed_request = None, data
        body = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                '<Message>injected by the test proxy</Message></Error>').encode()
        client.sendall(f"HTTP/1.1 {status} Injected\r\nContent-Type: application/xml\r\n"
                       f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        client.shutdown(socket.SHUT_WR)
        return True

    def _log(self, data: bytes) -> None:
        line, _, rest = data.partition(b"\r\n")
        if line.split(b" ", 1)[0] not in (b"GET", b"PUT", b"POST", b"DELETE", b"HEAD"):
            return  # a body, not a request
        headers = {key.strip().lower(): value.strip() for key, _, value in
                   (header.partition(b":") for header in rest.split(b"\r\n\r\n")[0].split(b"\r\n"))}
        self.requests.append((line.decode(errors="replace"), int(headers.get(b"content-length", b"0") or 0)))


def _reset(connection: socket.socket) -> None:
    try:
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST, not FIN
        connection.close()
    except OSError:
        pass
