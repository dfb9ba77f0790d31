"""The simulated cluster's supervisor stops its servers, even when interrupted again while stopping them."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuyard.sim.processes import STOP_GRACE_SECONDS, alive

# Ctrl-C raises KeyboardInterrupt as in a terminal, even when the test runs where SIGINT is inherited ignored
# (a background job of a non-interactive shell), which Python would keep ignoring
STOPPER = """
import signal, sys, threading, time
from pathlib import Path
from gpuyard.sim.processes import Supervisor
signal.signal(signal.SIGINT, signal.default_int_handler)
if sys.argv[3] == "threaded":  # as in pytest's workers: the kernel may hand the signal to this thread
    threading.Thread(target=time.sleep, args=(120,), daemon=True).start()
supervisor = Supervisor(Path(sys.argv[1]))
supervisor.start("stubborn", [sys.executable, "-c", sys.argv[2]])
while "up" not in (supervisor.logs / "stubborn.log").read_text():
    time.sleep(0.1)
print("stopping", flush=True)
supervisor.stop_all()
"""
STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(120)"


@pytest.mark.parametrize("threads", ["single", "threaded"])
def test_a_second_interrupt_while_stopping_still_leaves_no_server(tmp_path: Path, threads: str):
    stopper = subprocess.Popen([sys.executable, "-c", STOPPER, str(tmp_path), STUBBORN, threads],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert stopper.stdout.readline() == "stopping\n"
    pid = json.loads((tmp_path / "pids.json").read_text())["stubborn"]
    time.sleep(1)  # inside stop_all: the stubborn server ignores SIGTERM, the grace period runs
    stopper.send_signal(signal.SIGINT)
    _, err = stopper.communicate(timeout=STOP_GRACE_SECONDS + 20)
    assert stopper.returncode != 0 and "KeyboardInterrupt" in err  # the interrupt is delivered once stopped
    assert not alive(pid) or _zombie_or_gone(pid)
    assert not (tmp_path / "pids.json").exists()


def _zombie_or_gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except FileNotFoundError:
        return True
