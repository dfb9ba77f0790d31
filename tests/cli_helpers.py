"""Running ``gpuyard`` as users do (a real process) and checking the one-line error contract."""

from __future__ import annotations

import io
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GPUYARD = [sys.executable, "-m", "gpuyard.jobs.cli.main"]


def gpuyard(*args: str, cwd: Path = REPO, env: dict | None = None, timeout: float = 120,
            stdin: str | None = None) -> subprocess.CompletedProcess:
    variables = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200", **(env or {})}
    return subprocess.run([*GPUYARD, *args], capture_output=True, text=True, cwd=cwd, env=variables,
                          timeout=timeout, input=stdin if stdin is not None else "")


def gpuyard_forked(*args: str, cwd: Path = REPO, env: dict | None = None, timeout: float = 60,
                   stdin: str = "") -> subprocess.CompletedProcess:
    """``gpuyard ARGS`` in a process of its own, forked from this one once it has imported the CLI: the code, the
    environment, the working folder, stdin/stdout/stderr and the exit status of ``python -m gpuyard.jobs.cli.main ARGS``,
    without two seconds of imports per case (the bad-input tables run hundreds). The child leads a session of its
    own; ``session_left`` tells whether anything of it outlived it."""
    from gpuyard.jobs.cli.main import main

    variables = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200", **(env or {})}
    pipes = {name: os.pipe() for name in ("stdin", "stdout", "stderr")}
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child never returns into pytest
        code = 1
        try:
            os.setsid()
            for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
                os.dup2(pipes[name][0 if fd == 0 else 1], fd)
            for read, write in pipes.values():
                os.close(read)
                os.close(write)
            sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
            sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True)
            sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            os.chdir(cwd)
            os.environ.clear()
            os.environ.update(variables)
            sys.argv = ["gpuyard", *args]
            main()
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    os.close(pipes["stdin"][0])
    os.close(pipes["stdout"][1])
    os.close(pipes["stderr"][1])
    out = _exchange(pid, pipes["stdin"][1], {pipes["stdout"][0]: "stdout", pipes["stderr"][0]: "stderr"},
                    stdin.encode(), timeout)
    _, status = os.waitpid(pid, 0)
    result = subprocess.CompletedProcess(["gpuyard", *args], os.waitstatus_to_exitcode(status),
                                         out["stdout"].decode(errors="replace"), out["stderr"].decode(errors="replace"))
    result.session_left = session_members(pid)
    return result


def _exchange(pid: int, stdin_fd: int, readers: dict[int, str], data: bytes, timeout: float) -> dict[str, bytes]:
    out = {name: b"" for name in readers.values()}
    try:
        os.write(stdin_fd, data)
    except BrokenPipeError:
        pass
    os.close(stdin_fd)
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        for fd in readers:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            if time.monotonic() > deadline:
                os.killpg(pid, signal.SIGKILL)
                raise TimeoutError(f"gpuyard (pid {pid}) still running after {timeout}s")
            for key, _ in selector.select(timeout=1):
                chunk = os.read(key.fd, 65536)
                if chunk:
                    out[readers[key.fd]] += chunk
                else:
                    selector.unregister(key.fd)
                    os.close(key.fd)
    return out


def session_members(session: int) -> list[int]:
    """Live processes (zombies aside) of session ``session``."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == session and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def tree(folder: Path) -> dict[str, bytes | None]:
    """Every path under ``folder`` with its bytes (None for folders): to compare before and after a command."""
    return {str(path.relative_to(folder)): None if path.is_dir() else path.read_bytes()
            for path in sorted(folder.rglob("*")) if not path.is_symlink()}


def assert_one_line_error(result: subprocess.CompletedProcess, *names: str, code: int = 2) -> str:
    """Exit ``code`` (2), exactly one stderr line starting ``gpuyard: error:`` that contains every one of ``names``."""
    assert result.returncode == code, (result.returncode, result.stdout[-2000:], result.stderr[-2000:])
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuyard: error: "), result.stderr
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]
