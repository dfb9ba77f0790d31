"""Time ``gpuyard plan`` (a fresh CLI process, as a user runs it) for 1, 10 and 50 teams on the dev shape.

Prints one JSON object: per team count the resources planned, the wall seconds and the CPU seconds of the
process (goal: 50 teams < 10 s wall). CPU seconds stay meaningful on a busy machine; the load average is reported.
Usage: python bench/bench_plan.py [--teams 1 10 50] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from gpuyard.infra.config import stack_file

GOAL_SECONDS = 10.0


def write_stack(directory: Path, teams: int) -> str:
    """A copy of the dev stack with ``teams`` generated teams; returns its stack name."""
    document = yaml.safe_load(stack_file("dev").read_text())
    document["config"]["gpuyard:teams"] = [{"name": f"team{i:03d}", "gpu_quota": 4} for i in range(teams)]
    name = f"bench{teams}"
    (directory / f"Pulumi.{name}.yaml").write_text(yaml.safe_dump(document))
    return name


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_plan(stack: str, directory: Path) -> tuple[int, float, float]:
    """(resources, wall seconds, CPU seconds) of one ``gpuyard plan --json`` process."""
    env = {**os.environ, "GPUYARD_STACKS_DIR": str(directory)}
    command = [sys.executable, "-c", "from gpuyard.jobs.cli.main import main; main()", "plan", "--stack", stack, "--json"]
    cpu, start = _children_cpu(), time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    return len(json.loads(result.stdout)["resources"]), time.perf_counter() - start, _children_cpu() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teams", type=int, nargs="+", default=[1, 10, 50])
    parser.add_argument("--repeat", type=int, default=3)
    options = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for teams in options.teams:
            stack = write_stack(Path(tmp), teams)
            timings = [time_plan(stack, Path(tmp)) for _ in range(options.repeat)]
            seconds = sorted(wall for _, wall, _ in timings)
            cpu = sorted(cpu for _, _, cpu in timings)
            runs.append({
                "teams": teams,
                "resources": timings[0][0],
                "seconds_best": round(seconds[0], 2),
                "seconds_median": round(seconds[len(seconds) // 2], 2),
                "cpu_seconds_median": round(cpu[len(cpu) // 2], 2),
            })
    largest = max(runs, key=lambda run: run["teams"])
    print(json.dumps({
        "benchmark": "gpuyard plan --json (fresh process, dev shape)",
        "cpus": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 1),
        "runs": runs,
        "goal": f"{largest['teams']} teams < {GOAL_SECONDS} s",
        "goal_met": largest["seconds_median"] < GOAL_SECONDS,
    }, indent=1))


if __name__ == "__main__":
    main()
