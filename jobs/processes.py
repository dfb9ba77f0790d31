"""Child processes that never outlive the command, and signals that end it cleanly.

Children start in their own session, so a terminal's Ctrl-C reaches only the CLI, which then stops
each child's whole tree (torchrun's workers run in sessions of their own, hence the /proc walk).
SIGTERM is turned into the same KeyboardInterrupt as Ctrl-C, so ``finally`` blocks and context
managers run either way.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from pathlib import Path

from gpuyard.infra.signals import signals_deferred

GRACE_SECONDS = 10.0
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent() -> None:
    """A ``preexec_fn`` for servers: the kernel SIGTERMs the child when the thread that started it ends (prctl
    PR_SET_PDEATHSIG), so it outlives no parent, not even a SIGKILLed one (a pytest-xdist worker)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def interrupt_on_sigterm() -> None:
    """Make SIGTERM act like a terminal's Ctrl-C: SIGINT to the children in our process group (pulumi, kubectl;
    children in their own session are stopped by ``stop_tree``), KeyboardInterrupt here."""
    signal.signal(signal.SIGTERM, _as_ctrl_c)


def _as_ctrl_c(_signum: int, _frame) -> None:
    group = os.getpgrp()
    for pid in descendants(os.getpid()):
        try:
            if os.getpgid(pid) == group:
                os.kill(pid, signal.SIGINT)
        except ProcessLookupError:
            pass
    raise KeyboardInterrupt


def _parents() -> dict[int, int]:
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended while we looked
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    return parents


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid``, children first."""
    parents = _parents()
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    try:  # a zombie has ended; only its parent's wait is missing
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def stop_tree(process: subprocess.Popen, grace: float = GRACE_SECONDS) -> None:
    """SIGTERM ``process`` and everything below it; SIGKILL what is left after ``grace`` seconds.

    Runs with signals deferred, so a second Ctrl-C cannot leave the tree half-stopped.
    """
    with signals_deferred():
        if process.poll() is not None and not descendants(process.pid):
            return
        tree = [process.pid, *descendants(process.pid)]
        _signal_all(tree, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            process.poll()
            tree = [pid for pid in tree if alive(pid)] + [pid for pid in descendants(process.pid) if pid not in tree]
            if not tree:
                break
            time.sleep(0.05)
        _signal_all(tree, signal.SIGKILL)
        process.wait()


def run_child(command: list[str]) -> int:
    """Run ``command`` in its own session with inherited stdout/stderr; stopped with its tree on any exception."""
    process = subprocess.Popen(command, start_new_session=True)
    try:
        return process.wait()
    finally:
        stop_tree(process)
