"""Render 100 teams x 5 kinds and print JSON throughput (goal: everything in under 1 s).

    python bench/bench_render.py [--teams 100] [--repeat 3] [--out-parent /dev/shm]

Times the best of ``--repeat`` runs of: build every JobSpec, render it, dump it to YAML
(the goal); and, separately, ``render_all`` writing one file per manifest into a temporary
folder under ``--out-parent``, which on a busy disk is mostly file-creation time.
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

from gpuyard.infra.config import parse_stack
from gpuyard.jobs.render import default_specs, render, render_all, to_yaml
from gpuyard.jobs.spec import KINDS


def bench_stack(teams: int):
    return parse_stack("bench", {
        "gpuyard:cluster_name": "bench",
        "gpuyard:image_registry": "123456789012.dkr.ecr.us-west-2.amazonaws.com/bench",
        "gpuyard:teams": [{"name": f"team-{index:03d}"} for index in range(teams)],
        "gpuyard:addons": {"trainer_v2": True},
    })


def render_to_text(config) -> int:
    total = 0
    for spec in default_specs(config):
        total += len(to_yaml(render(spec, config.team(spec.team))))
    return total


def best_of(repeat: int, run) -> float:
    timings = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        timings.append(time.perf_counter() - start)
    return min(timings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teams", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out-parent", type=Path, default=None, help="where the temporary output folder goes")
    options = parser.parse_args()
    config = bench_stack(options.teams)
    manifests = options.teams * len(KINDS)
    in_memory = best_of(options.repeat, lambda: render_to_text(config))
    with tempfile.TemporaryDirectory(dir=options.out_parent) as tmp:
        to_disk = best_of(options.repeat, lambda: render_all(config, Path(tmp) / "out"))
    print(json.dumps({
        "teams": options.teams,
        "kinds": len(KINDS),
        "manifests": manifests,
        "yaml_bytes": render_to_text(config),
        "render_seconds": round(in_memory, 4),
        "manifests_per_s": round(manifests / in_memory),
        "goal_under_1s": in_memory < 1.0,
        "render_all_files_seconds": round(to_disk, 4),
        "files_under": str(options.out_parent or tempfile.gettempdir()),
    }))


if __name__ == "__main__":
    main()
