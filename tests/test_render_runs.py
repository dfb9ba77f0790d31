"""The rendered launch commands run the real trainer: torchrun and mpirun, their flags, the trainer args.

Only what a laptop cannot have is swapped: the rendezvous host (a Service in the cluster),
the metrics port (fixed in the cluster, free here) and the venv's executables.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.conventions import METRICS_PORT
from jobs.local_aws import free_port
from jobs.render import render
from jobs.workload.checkpoint import data_name
from render_helpers import STACK, make_spec


@pytest.mark.slow
def test_rendered_pytorchjob_command_trains_and_checkpoints(tmp_path):
    spec = make_spec("pytorchjob", nodes=1, gpus_per_node=0, epochs=2, checkpoint_uri=str(tmp_path / "ckpt"))
    master = render(spec, STACK.team("vision"))["spec"]["pytorchReplicaSpecs"]["Master"]
    trainer = master["template"]["spec"]["containers"][0]
    command = [str(Path(sys.executable).with_name("torchrun"))]
    command += ["--rdzv-endpoint=127.0.0.1:0" if arg.startswith("--rdzv-endpoint=") else arg
                for arg in trainer["command"][1:]]
    args = ["0" if arg == str(METRICS_PORT) else arg for arg in trainer["args"]]
    result = subprocess.run(command + args, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    events = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert events[-1]["event"] == "done" and events[-1]["epochs"] == 2
    assert sorted(path.name for path in (tmp_path / "ckpt").glob("*.pt")) == [data_name(128)]  # save_every=2



@pytest.mark.slow
def test_rendered_mpijob_launcher_command_trains(tmp_path):
    """The launcher's mpirun (-np, -x exports, python3 -m trainer) on this host's two slots."""
    spec = make_spec("mpijob", nodes=2, gpus_per_node=0, epochs=2, checkpoint_uri=str(tmp_path / "ckpt"))
    replicas = render(spec, STACK.team("vision"))["spec"]["mpiReplicaSpecs"]
    launcher = replicas["Launcher"]["template"]["spec"]["containers"][0]
    env = {item["name"]: item["value"] for item in launcher["env"]}
    env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),  # worker 0's Service in the cluster
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
            "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMP_NUM_THREADS": "1"}
    args = ["0" if arg == str(METRICS_PORT) else arg for arg in launcher["args"]]
    result = subprocess.run(launcher["command"] + args, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                            env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    events = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert events[-1]["event"] == "done" and events[-1]["epochs"] == 2  # JSON lines, no progress bar
    assert (tmp_path / "ckpt" / data_name(64)).exists()  # 2 epochs of 32 steps at world size 2
