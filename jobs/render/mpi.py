"""What MPIJob and Volcano Job share: mpirun on a CPU launcher, sshd on the workers.

The paths, user and port are the ``mpi`` image's (images/mpi): uid 1000 ``gpuyard``,
the job's SSH secret in ``/home/gpuyard/.ssh``, sshd on the unprivileged port 2222, which the
templates also pass explicitly (sshd ``-p``, mpirun's ``plm_rsh_args``).
Remote ranks start from sshd with a clean environment, so mpirun exports the
rendezvous, NCCL/EFA, the spec's env, the IRSA credentials and boto3's endpoint with ``-x``.
"""

from gpuyard.jobs.command import MPI_RANK_MODULE
from gpuyard.jobs.render.pod import container, helper_resources, metrics_port, trainer_env, trainer_resources
from gpuyard.jobs.spec import JobSpec
from gpuyard.jobs.workload.args import LAUNCH_MODULE

SSH_DIR = "/home/gpuyard/.ssh"
SSH_PORT = 2222
# How long a Volcano Job's launcher waits for every worker's sshd before it fails (and the job restarts).
SSHD_WAIT_SECONDS = 300
ENTRYPOINT = "/opt/gpuyard/mpi/entrypoint.sh"
MASTER_PORT = 29500
# Injected by the EKS pod identity webhook into pods of the team's (IRSA) service account.
IRSA_ENV = ("AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_REGION", "AWS_DEFAULT_REGION",
            "AWS_STS_REGIONAL_ENDPOINTS")
# boto3's endpoint where a pod has one (an S3-compatible store; the simulated cluster's, sim/irsa.py): unset on EKS.
ENDPOINT_ENV = ("AWS_ENDPOINT_URL",)
# The image's library path, where NCCL finds aws-ofi-nccl and libfabric (images/common/install-efa.sh).
IMAGE_ENV = ("LD_LIBRARY_PATH",)


def launcher_env(spec: JobSpec, master_addr: str) -> dict[str, str]:
    """The rendezvous, plain output (mpirun hands ranks a pty; rich then draws bars), the trainer's env."""
    return {"MASTER_ADDR": master_addr, "MASTER_PORT": str(MASTER_PORT), "TTY_INTERACTIVE": "0", **trainer_env(spec)}


def mpirun_command(spec: JobSpec, env: dict[str, str], hosts: list[str] | None = None) -> list[str]:
    """mpirun over ``nodes x procs_per_node`` slots up to the program (its args follow).

    ``hosts`` lists the workers when no hostfile is provided (Volcano); the MPI Operator
    points mpirun at its own hostfile.
    """
    command = ["mpirun", "-np", str(spec.nodes * spec.procs_per_node), "--bind-to", "none", "--map-by", "slot",
               "--mca", "plm_rsh_args", f"-p {SSH_PORT} -o ConnectionAttempts=10"]
    if hosts:
        command += ["--host", ",".join(f"{host}:{spec.procs_per_node}" for host in hosts)]
    for name in (*env, *IRSA_ENV, *ENDPOINT_ENV, *IMAGE_ENV):
        command += ["-x", name]
    return [*command, "python3", *rank_program(spec)]


def rank_program(spec: JobSpec) -> list[str]:
    """What each rank's python runs: the reference trainer reads mpirun's ranks itself, a user's command gets
    torchrun's variables through ``gpuyard.jobs.command.mpi_rank``."""
    if spec.user_command:
        return ["-m", MPI_RANK_MODULE, *spec.program]
    return list(spec.program)


def wait_for_sshd(hosts: list[str], port: int = SSH_PORT, seconds: int = SSHD_WAIT_SECONDS) -> list[str]:
    """A bash prefix that waits until every host accepts TCP on ``port``, for at most ``seconds``, then runs
    its arguments; past the deadline it names the host and exits 1."""
    script = (
        f"deadline=$((SECONDS + {seconds})); "
        f"for host in {' '.join(hosts)}; do "
        f"until (exec 3<>/dev/tcp/$host/{port}) 2>/dev/null; do "
        f"if ((SECONDS >= deadline)); then echo \"sshd of $host:{port} not reachable after {seconds}s\" >&2; exit 1; fi; "
        "sleep 2; done; done; "
        'exec "$@"'
    )
    return ["bash", "-c", script, "wait-for-sshd"]


def supervised(command: list[str], restarts: int = 0, hosts: list[str] | None = None) -> list[str]:
    """``command`` under ``gpuyard.jobs.workload.launch``: a SIGTERM exits 143, not mpirun's 1; with ``restarts`` a retryable
    status reruns it once every host's sshd answers again (at most SSHD_WAIT_SECONDS), as the first run waits."""
    options = []
    if restarts:
        options = ["--restarts", str(restarts), "--wait-for", ",".join(f"{host}:{SSH_PORT}" for host in hosts or []),
                   "--wait-seconds", str(SSHD_WAIT_SECONDS)]
    return ["python3", "-m", LAUNCH_MODULE, *options, "--", *command]


def launcher_container(
    name: str, spec: JobSpec, master_addr: str, hosts: list[str] | None = None, *, wait: bool = False,
    restarts: int = 0, restart_hosts: list[str] | None = None,
) -> dict:
    """The launcher's supervised mpirun; with ``wait`` (no operator gating the launcher) it first waits for the
    workers' sshd; ``restarts`` reruns a retryable failure after ``restart_hosts`` answer again."""
    env = launcher_env(spec, master_addr)
    command = supervised(mpirun_command(spec, env, hosts), restarts, restart_hosts)
    if wait:
        command = wait_for_sshd(hosts or []) + command
    return container(name, spec.image, helper_resources(), command=command, args=list(spec.args), env=env)


def worker_container(name: str, spec: JobSpec) -> dict:
    """sshd as the image's user, ready once it accepts connections; rank 0 serves metrics.

    No env here: the ranks sshd starts get theirs from mpirun's ``-x``.
    """
    ssh_port = {"name": "ssh", "containerPort": SSH_PORT, "protocol": "TCP"}
    worker = container(name, spec.image, trainer_resources(spec), command=[ENTRYPOINT],
                       args=["worker", "-p", str(SSH_PORT)], ports=[ssh_port, metrics_port()])
    worker["readinessProbe"] = {"tcpSocket": {"port": SSH_PORT}, "periodSeconds": 2}
    return worker
