"""A simulated cluster for one test module: started once, and stopped with no process or state left behind."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sim.cluster import Sim
from sim.processes import alive, zombie


@contextmanager
def running_sim(stack: str, state: Path, **options) -> Iterator[Sim]:
    """`Sim(stack, state, **options)` up for the block; afterwards every process it started is gone, and its state."""
    cluster = Sim(stack, state, **options)
    cluster.up(print)
    yield cluster
    started = cluster.supervisor.pids()
    cluster.down()
    assert not cluster.state.exists()
    assert not [name for name, pid in started.items() if alive(pid) and not zombie(pid)]
