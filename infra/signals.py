"""Stop signals held back while a block runs, for the CLI, the offline plan and the sim's teardown alike."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP until the block is done (then deliver the first), so it is never cut in half.

    On the main thread their handlers note them: blocking them there would not do, since the kernel hands a signal
    to any thread that does not block it and Python runs the handler on the main thread all the same (pytest's
    workers have such threads: a sim's teardown cut short there left kube-proxy's chains behind). Another thread,
    which cannot set handlers, blocks them."""
    if threading.current_thread() is not threading.main_thread():
        held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        return
    received: list[int] = []
    previous = {sig: signal.signal(sig, lambda number, _frame: received.append(number)) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if received:
            signal.raise_signal(received[0])
