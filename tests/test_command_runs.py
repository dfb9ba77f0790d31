"""The rendered launch command of every kind really runs a user's script per rank: torchrun (PyTorchJob, TrainJob),
mpirun (MPIJob, Volcano Job) and the Ray entry (RayJob), here on this machine, two ranks doing DDP over gloo.

Only what a laptop cannot have is swapped: hosts and ports that are Services in the cluster (the rendezvous,
the workers' sshd, the TrainingRuntime's ``PET_*`` variables) and the venv's executables.
"""

import json
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.local_aws import free_port
from jobs.render import render
from render_helpers import STACK, make_spec

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent
USER_SCRIPT = '''\
"""A user's own DDP script, written for torchrun: env:// rendezvous over gloo, one file per rank."""
import json, os, sys
from pathlib import Path

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 1))
model(torch.ones(4, 2)).sum().backward()
total = torch.tensor([rank + 1.0])
dist.all_reduce(total)
out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
(out / f"rank-{rank}.json").write_text(json.dumps({
    "world": world, "sum": total.item(), "local_rank": int(os.environ["LOCAL_RANK"]), "argv": sys.argv[2:],
    "grad": model.module.weight.grad.tolist()}))
print(f"rank {rank} of {world} done", flush=True)
dist.destroy_process_group()
'''


@pytest.fixture
def workdir(tmp_path) -> Path:
    """The image's working folder: the user's script as ``train_ddp.py`` and as the module ``mypkg.train``."""
    (tmp_path / "train_ddp.py").write_text(USER_SCRIPT)
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "train.py").write_text(USER_SCRIPT)
    return tmp_path


def container_env(container: dict) -> dict[str, str]:
    return {item["name"]: item["value"] for item in container.get("env", [])}


def local_env(extra: dict[str, str]) -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1", **extra}


def assert_ranks_ran(out: Path, argv: list[str], world: int = 2) -> None:
    ranks = [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(world)]
    assert [rank["world"] for rank in ranks] == [world] * world
    assert [rank["sum"] for rank in ranks] == [world * (world + 1) / 2] * world  # all_reduce across the ranks
    assert [rank["argv"] for rank in ranks] == [argv] * world
    assert ranks[0]["grad"] == ranks[1]["grad"]  # DDP averaged the gradients


def run(command: list[str], workdir: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=workdir, env=env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result


def test_pytorchjob_torchrun_runs_the_script_on_every_rank(workdir):
    spec = make_spec("pytorchjob", nodes=1, gpus_per_node=2, command=["train_ddp.py", str(workdir / "out"), "a"])
    master = render(spec, STACK.team("vision"))["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    trainer = master["containers"][0]
    command = [sys.executable] + ["--rdzv-endpoint=127.0.0.1:0" if arg.startswith("--rdzv-endpoint=") else arg
                                  for arg in trainer["command"][1:]]
    run(command + trainer["args"], workdir, local_env(container_env(trainer)))
    assert_ranks_ran(workdir / "out", ["a"])


def test_trainjob_torchrun_runs_the_module_on_every_rank(workdir):
    """torchrun reads nodes, ranks and the master from the TrainingRuntime's ``PET_*`` variables (a stand-in here)."""
    spec = make_spec("trainjob", nodes=1, gpus_per_node=2, command=["-m", "mypkg.train", str(workdir / "out"), "b"])
    trainer = render(spec, STACK.team("vision"))["spec"]["trainer"]
    runtime = {"PET_NNODES": "1", "PET_NPROC_PER_NODE": str(trainer["numProcPerNode"]), "PET_NODE_RANK": "0",
               "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(free_port())}
    env = local_env({**container_env(trainer), **runtime})
    run([sys.executable, *trainer["command"][1:], *trainer["args"]], workdir, env)
    assert_ranks_ran(workdir / "out", ["b"])


def mpi_env(launcher: dict) -> dict[str, str]:
    return local_env({**container_env(launcher), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
                      "OMPI_MCA_rmaps_base_oversubscribe": "1", "OMPI_ALLOW_RUN_AS_ROOT": "1",
                      "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})


def test_mpijob_launcher_mpirun_runs_the_script_on_every_rank(workdir):
    spec = make_spec("mpijob", nodes=2, gpus_per_node=0, command=["train_ddp.py", str(workdir / "out"), "c"])
    launcher = render(spec, STACK.team("vision"))["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    container = launcher["containers"][0]
    with socket.create_server(("127.0.0.1", 0)) as sshd:  # the workers' sshd, waited for only before a rerun
        command = list(container["command"])
        command[command.index("--wait-for") + 1] = f"127.0.0.1:{sshd.getsockname()[1]}"
        run(command + container["args"], workdir, mpi_env(container))
    assert_ranks_ran(workdir / "out", ["c"])


def test_volcanojob_master_mpirun_runs_the_script_on_every_rank(workdir):
    """The master's mpirun after its wait for the workers' sshd, with this host's two slots for the workers'."""
    spec = make_spec("volcanojob", nodes=2, gpus_per_node=0, command=["train_ddp.py", str(workdir / "out"), "d"])
    task = render(spec, STACK.team("vision"))["spec"]["tasks"][0]["template"]["spec"]
    container = task["containers"][0]
    command = container["command"][container["command"].index("python3"):]  # past bash's wait for sshd
    command[command.index("--host") + 1] = "localhost:2"
    run(command + container["args"], workdir, mpi_env(container))
    assert_ranks_ran(workdir / "out", ["d"])


def test_rayjob_entry_runs_the_script_under_ray_train_workers(workdir):
    """A local Ray instance stands in for the RayCluster (no RAY_ADDRESS); every rank's lines reach the driver."""
    spec = make_spec("rayjob", nodes=2, gpus_per_node=0, command=["train_ddp.py", str(workdir / "out"), "e"])
    manifest = render(spec, STACK.team("vision"))
    entrypoint = shlex.split(manifest["spec"]["entrypoint"])
    worker = manifest["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    env = local_env(container_env(worker))
    env.pop("RAY_ADDRESS", None)
    result = run([sys.executable, *entrypoint[1:]], workdir, env)
    assert_ranks_ran(workdir / "out", ["e"])
    assert "[rank 0] rank 0 of 2 done" in result.stdout and "[rank 1] rank 1 of 2 done" in result.stdout
