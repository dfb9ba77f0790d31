"""What every training process of a gpuyard job finds in its environment, the same in every kind.

A user's script reads these instead of flags, so one script runs under any launcher; the reference trainer
gets the same values as arguments. Plain names only: ``jobs.render.pod`` fills them from the JobSpec.
"""

JOB_NAME = "GPUYARD_JOB_NAME"  # the job object's name, unique per submission by default
TEAM = "GPUYARD_TEAM"  # the team whose namespace, queue and checkpoint prefix the job uses
CHECKPOINT_URI = "GPUYARD_CHECKPOINT_URI"  # s3://<bucket>/<team's prefix><job name>: the job's own folder
GRACE_PERIOD_SECONDS = "GPUYARD_GRACE_PERIOD_SECONDS"  # from this process's SIGTERM to its SIGKILL
METRICS_PORT = "GPUYARD_METRICS_PORT"  # the pod's scraped metrics port, for one process per pod
VARIABLES = (JOB_NAME, TEAM, CHECKPOINT_URI, GRACE_PERIOD_SECONDS, METRICS_PORT)
