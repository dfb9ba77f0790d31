"""One MPI rank of the user's command, with the variables torchrun would have set.

    mpirun ... python3 -m gpuyard.jobs.command.mpi_rank SCRIPT.py ARGS...    (or -m MODULE ARGS...)

mpirun gives each rank ``OMPI_COMM_WORLD_*``; a script written for torchrun reads ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` (and ``MASTER_ADDR``/``MASTER_PORT``, which the
templates export with ``-x``) and calls ``init_process_group("env://")``. This checks mpirun's values
(``gpuyard.jobs.workload.dist.launcher_env``), sets torchrun's and replaces itself with ``python3 COMMAND``, so
the rank's process is the user's: its signals and exit status are the rank's.
"""

from __future__ import annotations

import os
import sys

from gpuyard.jobs.workload.dist import LaunchError, launcher_env


def torchrun_variables(environ: dict[str, str]) -> dict[str, str]:
    """``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` from mpirun's (or torchrun's) environment."""
    env = launcher_env(environ)
    return {"RANK": str(env.rank), "WORLD_SIZE": str(env.world_size), "LOCAL_RANK": str(env.local_rank),
            "LOCAL_WORLD_SIZE": str(env.local_world_size)}


def main(argv: list[str]) -> None:
    if not argv:
        sys.stderr.write("mpi_rank: error: give the command: SCRIPT.py ARGS... or -m MODULE ARGS...\n")
        raise SystemExit(2)
    try:
        variables = torchrun_variables(dict(os.environ))
    except LaunchError as error:
        sys.stderr.write(f"mpi_rank: error: {error}\n")
        raise SystemExit(2) from None
    os.environ.update(variables)
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
