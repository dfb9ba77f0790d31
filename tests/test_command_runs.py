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

from gpuyard.jobs.local_aws import free_port
from gpuyard.infra.conventions import METRICS_PORT
from gpuyard.jobs.render import render
from gpuyard.jobs.spec import JobSpec
from render_helpers import STACK, make_spec

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent
USER_SCRIPT = '''\
"""A user's own DDP script, written for torchrun: env:// rendezvous over gloo, one file per rank in the job's
checkpoint folder, which the contract names (GPUYARD_CHECKPOINT_URI, here a local path)."""
import json, os, sys
from pathlib import Path

CONTRACT = ("GPUYARD_JOB_NAME", "GPUYARD_TEAM", "GPUYARD_CHECKPOINT_URI", "GPUYARD_GRACE_PERIOD_SECONDS",
            "GPUYARD_METRICS_PORT", "GPUYARD_DATA_URI")

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 1))
model(torch.ones(4, 2)).sum().backward()
total = torch.tensor([rank + 1.0])
dist.all_reduce(total)
out = Path(os.environ["GPUYARD_CHECKPOINT_URI"])
out.mkdir(parents=True, exist_ok=True)
(out / f"rank-{rank}.json").write_text(json.dumps({
    "world": world, "sum": total.item(), "local_rank": int(os.environ["LOCAL_RANK"]), "argv": sys.argv[1:],
    "grad": model.module.weight.grad.tolist(), "contract": {name: os.environ[name] for name in CONTRACT}}))
print(f"rank {rank} of {world} done", flush=True)
dist.destroy_process_group()
os._exit(0)  # as the README advises: torch's teardown now and then aborts after this (exit 134; CI of stop 34)
'''


@pytest.fixture
def workdir(tmp_path) -> Path:
    """The image's working folder: the user's script as ``train_ddp.py`` and as the module ``mypkg.train``."""
    (tmp_path / "train_ddp.py").write_text(USER_SCRIPT)
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "train.py").write_text(USER_SCRIPT)
    return tmp_path


def own_spec(kind: str, command: list[str], workdir: Path, **fields) -> JobSpec:
    """A job of ``kind`` running ``command``, its checkpoint folder in ``workdir``."""
    return make_spec(kind, command=command, checkpoint_uri=str(workdir / "ckpt"), **fields)


def container_env(container: dict) -> dict[str, str]:
    return {item["name"]: item["value"] for item in container.get("env", [])}


def local_env(extra: dict[str, str]) -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1", **extra}


def assert_ranks_ran(spec: JobSpec, argv: list[str], grace: int, world: int = 2) -> None:
    """Every rank joined one process group, saw the same contract and wrote where it says."""
    out = Path(spec.checkpoint_uri)
    ranks = [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(world)]
    contract = {"GPUYARD_JOB_NAME": spec.name, "GPUYARD_TEAM": "vision", "GPUYARD_CHECKPOINT_URI": str(out),
                "GPUYARD_GRACE_PERIOD_SECONDS": str(grace), "GPUYARD_METRICS_PORT": str(METRICS_PORT),
                "GPUYARD_DATA_URI": spec.data_uri}
    assert [rank["contract"] for rank in ranks] == [contract] * world
    assert [rank["world"] for rank in ranks] == [world] * world
    assert [rank["sum"] for rank in ranks] == [world * (world + 1) / 2] * world  # all_reduce across the ranks
    assert [rank["argv"] for rank in ranks] == [argv] * world
    assert ranks[0]["grad"] == ranks[1]["grad"]  # DDP averaged the gradients


def run(command: list[str], workdir: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=workdir, env=env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result


def test_pytorchjob_torchrun_runs_the_script_on_every_rank(workdir):
    spec = own_spec("pytorchjob", ["train_ddp.py", "a"], workdir, nodes=1, gpus_per_node=2)
    master = render(spec, STACK.team("vision"))["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    trainer = master["containers"][0]
    command = [sys.executable] + ["--rdzv-endpoint=127.0.0.1:0" if arg.startswith("--rdzv-endpoint=") else arg
                                  for arg in trainer["command"][1:]]
    run(command + trainer["args"], workdir, local_env(container_env(trainer)))
    assert_ranks_ran(spec, ["a"], grace=300)


def test_trainjob_torchrun_runs_the_module_on_every_rank(workdir):
    """torchrun reads nodes, ranks and the master from the TrainingRuntime's ``PET_*`` variables (a stand-in here)."""
    spec = own_spec("trainjob", ["-m", "mypkg.train", "b"], workdir, nodes=1, gpus_per_node=2)
    trainer = render(spec, STACK.team("vision"))["spec"]["trainer"]
    runtime = {"PET_NNODES": "1", "PET_NPROC_PER_NODE": str(trainer["numProcPerNode"]), "PET_NODE_RANK": "0",
               "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(free_port())}
    env = local_env({**container_env(trainer), **runtime})
    run([sys.executable, *trainer["command"][1:], *trainer["args"]], workdir, env)
    assert_ranks_ran(spec, ["b"], grace=300)


def mpi_env(launcher: dict) -> dict[str, str]:
    return local_env({**container_env(launcher), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
                      "OMPI_MCA_rmaps_base_oversubscribe": "1", "OMPI_ALLOW_RUN_AS_ROOT": "1",
                      "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})


def test_mpijob_launcher_mpirun_runs_the_script_on_every_rank(workdir):
    spec = own_spec("mpijob", ["train_ddp.py", "c"], workdir, nodes=2, gpus_per_node=0)
    launcher = render(spec, STACK.team("vision"))["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    container = launcher["containers"][0]
    with socket.create_server(("127.0.0.1", 0)) as sshd:  # the workers' sshd, waited for before each run
        command = list(container["command"])
        command[command.index("--wait-for") + 1] = f"127.0.0.1:{sshd.getsockname()[1]}"
        run(command + container["args"], workdir, mpi_env(container))
    assert_ranks_ran(spec, ["c"], grace=100)


def test_volcanojob_master_mpirun_runs_the_script_on_every_rank(workdir):
    """The master's mpirun after its wait for the workers' sshd, with this host's two slots for the workers'."""
    spec = own_spec("volcanojob", ["train_ddp.py", "d"], workdir, nodes=2, gpus_per_node=0)
    task = render(spec, STACK.team("vision"))["spec"]["tasks"][0]["template"]["spec"]
    container = task["containers"][0]
    command = container["command"][container["command"].index("python3"):]  # past bash's wait for sshd
    command[command.index("--host") + 1] = "localhost:2"
    run(command + container["args"], workdir, mpi_env(container))
    assert_ranks_ran(spec, ["d"], grace=100)


def test_rayjob_entry_runs_the_script_under_ray_train_workers(workdir):
    """A local Ray instance stands in for the RayCluster (no RAY_ADDRESS); every rank's lines reach the driver."""
    spec = own_spec("rayjob", ["train_ddp.py", "e"], workdir, nodes=2, gpus_per_node=0)
    manifest = render(spec, STACK.team("vision"))
    entrypoint = shlex.split(manifest["spec"]["entrypoint"])
    worker = manifest["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    env = local_env(container_env(worker))
    env.pop("RAY_ADDRESS", None)
    result = run([sys.executable, *entrypoint[1:]], workdir, env)
    assert_ranks_ran(spec, ["e"], grace=300)
    assert "[rank 0] rank 0 of 2 done" in result.stdout and "[rank 1] rank 1 of 2 done" in result.stdout
