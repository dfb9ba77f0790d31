"""The rendered PyTorchJob command runs the real trainer: torchrun, rendezvous flags, trainer args.

Only what a laptop cannot have is swapped: the rendezvous host (the master's Service),
the metrics port (fixed in the cluster, free here) and the torchrun path (the venv's).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from infra.conventions import METRICS_PORT
from jobs.render import render
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
    assert sorted(path.name for path in (tmp_path / "ckpt").glob("*.pt")) == ["ckpt-000002.pt"]  # save_every=2
