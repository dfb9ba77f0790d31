"""Who am I in the job: ranks from the launcher's environment, and the process group.

One code path for every launcher: torchrun (``RANK``/``WORLD_SIZE``/``LOCAL_RANK``), Ray Train
(sets the same variables and starts the process group itself), mpirun (``OMPI_COMM_WORLD_*``
with ``MASTER_ADDR``/``MASTER_PORT`` passed through ``-x``) and plain ``python`` (world size 1).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")  # torchrun and Ray Train
MPIRUN_VARIABLES = ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                    "OMPI_COMM_WORLD_LOCAL_SIZE")


class LaunchError(ValueError):
    """The launcher's environment is incomplete, as one line."""


@dataclass(frozen=True)
class DistEnv:
    """This process's place in the job."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launcher_env(environ: Mapping[str, str] = os.environ) -> DistEnv:
    """Read the ranks the launcher gave this process; plain ``python`` is rank 0 of 1.

    torchrun and Ray Train set ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``; mpirun sets
    ``OMPI_COMM_WORLD_*`` and, torch having no MPI backend here, the gloo rendezvous needs
    ``MASTER_ADDR``/``MASTER_PORT`` from ``-x``. Every value is checked (a LaunchError names the variable), so a
    wrong one stops the trainer before any process group: ranks below their sizes, a port, a thread count.
    """
    if MPIRUN_VARIABLES[0] in environ and not {"MASTER_ADDR", "MASTER_PORT"} <= environ.keys():
        raise LaunchError("mpirun: pass MASTER_ADDR and MASTER_PORT with -x (gloo rendezvous)")
    if "OMP_NUM_THREADS" in environ:
        _whole(environ, "OMP_NUM_THREADS", "1", low=1)
    for names in (TORCHRUN_VARIABLES, MPIRUN_VARIABLES):
        if names[0] in environ:
            rank, world, local_rank, local_world = names
            env = DistEnv(_whole(environ, rank, "0"), _whole(environ, world, "1", low=1),
                          _whole(environ, local_rank, "0"), _whole(environ, local_world, "1", low=1))
            for index, size, index_name, size_name in ((env.rank, env.world_size, rank, world),
                                                       (env.local_rank, env.local_world_size, local_rank, local_world)):
                if index >= size:
                    raise LaunchError(f"{index_name}={index} is not below {size_name}={size}")
            if env.world_size > 1 and "MASTER_PORT" in environ:
                _whole(environ, "MASTER_PORT", "", low=1, high=65535)
            return env
    return DistEnv()


def _whole(environ: Mapping[str, str], name: str, default: str, low: int = 0, high: int = 2**31 - 1) -> int:
    text = environ.get(name, default)
    if not re.fullmatch(r"[0-9]{1,10}", text) or not low <= int(text) <= high:
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise LaunchError(f"{name}={shown!r} is not a whole number from {low} to {high} (the launcher's environment)")
    return int(text)


def backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def device(env: DistEnv) -> torch.device:
    if torch.cuda.is_available():
        torch.cuda.set_device(env.local_rank)
        return torch.device("cuda", env.local_rank)
    return torch.device("cpu")


def pin_cpu_threads(env: DistEnv, environ: Mapping[str, str] = os.environ) -> None:
    """Give every launcher the same intra-op thread count, so CPU results match bitwise."""
    threads = environ.get("OMP_NUM_THREADS") or max(1, (os.cpu_count() or 1) // env.local_world_size)
    torch.set_num_threads(int(threads))


def init_process_group(env: DistEnv) -> None:
    """Join the job's process group (a no-op under Ray Train, which has already done it)."""
    if dist.is_initialized():
        return
    if env.world_size == 1:
        dist.init_process_group(backend(), store=dist.HashStore(), rank=0, world_size=1)
        return
    store, rank, world_size = next(dist.rendezvous("env://", rank=env.rank, world_size=env.world_size))
    # torchrun keeps its store across restarts: without a per-attempt prefix, restarted workers can
    # read the gloo addresses of the killed ones and hang in connectFullMesh
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    dist.init_process_group(backend(), store=dist.PrefixStore(f"attempt_{attempt}", store),
                            rank=rank, world_size=world_size)


def agree_exit_code(code: int, on: torch.device) -> int:
    """The highest exit status any rank asks for, returned on every rank (so also a barrier)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return code
    codes = torch.tensor([code], device=on)
    dist.all_reduce(codes, op=dist.ReduceOp.MAX)
    return int(codes.item())


def destroy_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def leave(exit_code: int) -> None:
    """End this process with ``exit_code`` once its output is flushed, without the interpreter's teardown: with
    torch loaded that takes seconds on a busy node (too long within a grace period) and now and then aborts in a
    C++ destructor after the process group is gone ("terminate called without an active exception", exit 134)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)


def lost_peer(error: BaseException) -> bool:
    """Whether a collective failed because another rank or its node went away (so a rerun may succeed).

    NCCL raises DistBackendError (a DistError); gloo a plain RuntimeError from its TCP transport
    ("[.../gloo/transport/tcp/pair.cc:...] Read error ...: Connection reset by peer", torch 2.13).
    """
    return isinstance(error, dist.DistError) or (isinstance(error, RuntimeError) and "/gloo/transport/" in str(error))
