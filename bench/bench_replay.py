"""Replay a simulated day of gangs on the prod shapes with 20 teams, for 100, 250 and 500 gangs.

    python bench/bench_replay.py [--sizes 100 250 500] [--speed 144] [--lock FILE]

The stack is a copy of stacks/Pulumi.prod.yaml (same pools, Karpenter families and limits) whose team list is
prod's three teams plus 17 generated ones (weights 1, 2 or 4, quotas of 64 GPUs), written to a temporary stacks
folder. Each size gets a synthetic trace (seed 1, arrivals over 24 h, shapes 1x1, 1x8, 2x8, 4x8, mean duration
45 min) and a fresh simulated cluster with Karpenter (sim/replay.py); ``--lock`` holds that file (flock) for each
replay only, so a shared machine can interleave other simulated clusters between sizes. Each size's whole report
goes to stderr as one JSON line as soon as it is done. Prints one JSON object:
per size ``gangs``, ``admitted``, ``explained``, ``unexplained``, ``gpu_utilization``, ``wall_s`` (and the rest of
the replay's cluster figures), ``teams`` of the largest size (per team ``wait_p50_s``, ``wait_p95_s``,
``cost_usd``, ...), and how wall time grows with the number of gangs.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import sys
import tempfile
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import yaml

from gpuyard.infra.config import STACKS_DIR_ENV, load_stack, stack_file
from gpuyard.jobs.processes import interrupt_on_sigterm
from gpuyard.sim.cluster import Sim
from gpuyard.sim.replay import consolidation, run
from gpuyard.sim.trace import synthetic_trace

TEAMS = 20
STACK = "prod"


def write_stacks(directory: Path) -> None:
    """prod with TEAMS teams: its own three and generated ones."""
    document = yaml.safe_load(stack_file(STACK).read_text())
    teams = document["config"]["gpuyard:teams"]
    teams += [{"name": f"team{i:02d}", "queue_weight": (1, 2, 4)[i % 3], "gpu_quota": 64, "cpu_quota": 768,
               "memory_quota_gib": 8192} for i in range(len(teams) + 1, TEAMS + 1)]
    (directory / f"Pulumi.{STACK}.yaml").write_text(yaml.safe_dump(document))


@contextmanager
def held(path: Path):
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def replay(size: int, speed: float, lock: Path | None, state: Path) -> dict:
    config = load_stack(STACK)
    gangs = synthetic_trace(config, size, hours=24, seed=1, mean_duration_s=45 * 60)
    with held(lock) if lock else nullcontext():
        sim = Sim(STACK, state / f"replay-{size}", karpenter=True, consolidate_after=consolidation(speed))
        started = time.monotonic()
        try:
            sim.up(lambda line: print(line, file=sys.stderr))
            up_s = time.monotonic() - started
            report = run(sim, config, gangs, speed, lambda line: print(line, file=sys.stderr))
        finally:
            sim.down()
    report["sim_up_s"] = round(up_s, 1)
    print(json.dumps({"size": size, **report}), file=sys.stderr)  # kept should a later size be cut short
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 250, 500])
    parser.add_argument("--speed", type=float, default=144.0, help="cluster seconds per wall second (a day: 10 min)")
    parser.add_argument("--lock", type=Path, help="flock this file around each replay")
    args = parser.parse_args()
    interrupt_on_sigterm()  # a SIGTERM stops the simulated cluster too (Sim.down in replay's finally)
    with tempfile.TemporaryDirectory(prefix="bench-replay-") as folder:
        stacks = Path(folder) / "stacks"
        stacks.mkdir()
        write_stacks(stacks)
        os.environ[STACKS_DIR_ENV] = str(stacks)
        reports = {size: replay(size, args.speed, args.lock, Path(folder)) for size in args.sizes}
    keys = ("gangs", "admitted", "explained", "unexplained", "gpu_utilization", "wall_s", "sim_up_s", "simulated_s",
            "gpu_hours", "idle_gpu_hours", "cost_usd", "idle_gpu_cost_usd", "reclaim_evictions", "failed")
    largest = reports[max(reports)]
    smallest = reports[min(reports)]
    print(json.dumps({
        "stack": f"{STACK} shapes, {TEAMS} teams", "speed": args.speed,
        "sizes": {str(size): {key: report[key] for key in keys} for size, report in reports.items()},
        "wall_s_growth": round(largest["wall_s"] / smallest["wall_s"], 2),
        "gangs_growth": round(max(reports) / min(reports), 2),
        "teams": largest["teams"],
        "explanations": largest["explanations"],
    }, indent=1))


if __name__ == "__main__":
    main()
