"""The README's own-script example as a data scientist takes it to a simulated cluster: built into an image of a
kind, the `gpuyard` commands they type, the one line each rank prints, and the same script run here."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gpuyard.infra.config import StackConfig
from gpuyard.jobs.local_aws import free_port
from gpuyard.sim.cluster import Sim
from test_workload_library import readme_script


def gpuyard(sim: Sim, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`gpuyard ARGS` as the user runs it, with `export KUBECONFIG=$(gpuyard sim kubeconfig | tail -1)`."""
    return subprocess.run([sys.executable, "-m", "gpuyard.jobs.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "KUBECONFIG": str(sim.kubeconfig)})


def user_lines(text: str) -> list[dict]:
    """The script's one line a rank, by rank."""
    lines = [json.loads(line[line.index("{"):]) for line in text.splitlines() if '{"rank"' in line]
    return sorted(lines, key=lambda line: line["rank"])


def submit_script(sim: Sim, config: StackConfig, image: str, team: str, kind: str, cpu: str, steps: int,
                  save_every: int, env: list[str] = ()) -> str:
    """`gpuyard submit --kind KIND` of the script on its image (no --name: a new name), CPU-only, with ``env``
    (KEY=VALUE) and nothing else: its pods reach the sim's bucket with the team's IRSA credentials; returns the
    job's name."""
    result = gpuyard(sim, "submit", "--stack", config.stack, "--team", team, "--kind", kind, "--gpus-per-node", "0",
                     "--cpu", cpu, "--image", image, *(f"--env={pair}" for pair in env), "--", "train.py", str(steps),
                     str(save_every))
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


@contextmanager
def script_image(sim: Sim, registry_prefix: str, project: Path, team: str, kind: str) -> Iterator[str]:
    """The script in the folder ``project``, built by `gpuyard images build --context` on the image of ``kind`` and
    pushed to the sim's registry (BuildKit: no Docker engine here); removed afterwards."""
    (project / "train.py").write_text(readme_script())
    built = gpuyard(sim, "images", "build", "--context", str(project), "--team", team, "--kind", kind,
                    "--registry", registry_prefix, "--push")
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    ref = built.stdout.splitlines()[-1]
    address = registry_prefix.split("/", 1)[0]
    repository, tag = ref.removeprefix(f"{address}/").rsplit(":", 1)
    _, body = sim.registry().manifest(repository, tag)
    try:
        yield ref
    finally:  # the registry's storage is the cache's: leave no test image in it
        request = urllib.request.Request(f"http://{address}/v2/{repository}/manifests/"
                                         f"sha256:{hashlib.sha256(body).hexdigest()}", method="DELETE")
        urllib.request.urlopen(request, timeout=30).close()


@contextmanager
def run_here(folder: Path, log: Path, steps: int, save_every: int) -> Iterator[subprocess.Popen]:
    """The script under torchrun with 2 ranks here, as on the user's laptop, checkpointing to a local folder."""
    (folder / "train.py").write_text(readme_script())
    with log.open("w") as out:
        run = subprocess.Popen(
            [str(Path(sys.executable).parent / "torchrun"), "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
             "--master-port", str(free_port()), "train.py", str(steps), str(save_every)], cwd=folder,
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "GPUYARD_CHECKPOINT_URI": str(folder / "checkpoints")})
    try:
        yield run
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
