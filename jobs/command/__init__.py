"""Running the user's own command per rank under each launcher (``gpuyard render ... -- SCRIPT.py ARGS``).

torchrun runs the command itself; mpirun runs it through ``mpi_rank`` (torchrun's rank variables from
mpirun's); a RayJob through ``ray_entry`` (one process per Ray Train worker).
"""

MPI_RANK_MODULE = "gpuyard.jobs.command.mpi_rank"
RAY_ENTRY_MODULE = "gpuyard.jobs.command.ray_entry"
