"""The one pod-template builder every renderer shares.

A *trainer* pod runs on the spec's NodePool with its GPUs (requests = limits), the GPU
taint's toleration, /dev/shm in memory, NCCL (and EFA) settings and the metrics port.
A *helper* pod (MPI launcher, Ray head) is a small CPU pod on the on-demand cpu pool.
Both are non-root, use the team's service account and priority class, carry the gpuyard
labels and ask Karpenter not to disrupt them while the gang runs.
"""

from __future__ import annotations

from gpuyard.infra.config import Team
from gpuyard.infra.conventions import (
    ANNOTATION_DO_NOT_DISRUPT,
    EFA_RESOURCE,
    GRACE_PERIOD_SECONDS,
    GPU_RESOURCE,
    HUGEPAGES_EFA,
    HUGEPAGES_RESOURCE,
    GPU_TAINT_EFFECT,
    GPU_TAINT_KEY,
    GPU_TAINT_VALUE,
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_INSTANCE_FAMILY,
    LABEL_JOB,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    LABEL_PART_OF,
    LABEL_TEAM,
    METRICS_PORT,
    METRICS_PORT_NAME,
    NODEPOOL_CPU,
    PART_OF,
    SHM_PATH,
    SHM_VOLUME,
    container_security,
    contract_env,
    network_env,
    node_selector,
    pod_security,
)
from gpuyard.jobs.spec import HELPER_CPU, HELPER_MEMORY_GIB, JobSpec

# On the job object, for people and tools looking for a job's checkpoints.
ANNOTATION_CHECKPOINT_URI = "gpuyard.io/checkpoint-uri"


def labels(spec: JobSpec, component: str | None = None) -> dict[str, str]:
    """The labels on every object and pod of a job (the PodMonitor selects on them)."""
    out = {
        LABEL_NAME: spec.kind,
        LABEL_INSTANCE: spec.name,
        LABEL_PART_OF: PART_OF,
        LABEL_MANAGED_BY: PART_OF,
        LABEL_TEAM: spec.team,
        LABEL_JOB: spec.name,
    }
    if component:
        out[LABEL_COMPONENT] = component
    return out


def metadata(spec: JobSpec, team: Team, extra_labels: dict[str, str] | None = None) -> dict:
    """The job object's name, namespace, labels and where its checkpoints go."""
    return {
        "name": spec.name,
        "namespace": team.namespace,
        "labels": {**labels(spec), **(extra_labels or {})},
        "annotations": {ANNOTATION_CHECKPOINT_URI: spec.checkpoint_uri},
    }


def shutdown_env(spec: JobSpec) -> dict[str, str]:
    """Let the launchers give the trainer the pod's grace period after they forward SIGTERM.

    torchrun SIGKILLs its workers TORCH_ELASTIC_SHUTDOWN_TIMEOUT s after forwarding (default 30; torch
    2.13 torch/distributed/launcher/api.py). Open MPI 4's mpirun forwards SIGTERM odls_base_sigkill_timeout
    s after getting it, then SIGKILLs as long after (default 1; ompi v4.1.x
    orte/mca/odls/base/odls_base_default_fns.c): a third of the grace each leaves mpirun a third to exit. The
    launcher's supervisor does not send the reference trainer's mpirun that SIGTERM but SIGUSR1, which mpirun
    forwards at once (gpuyard.jobs.workload.launch); mpirun's abort on the ranks' 143 then takes two thirds at most.
    """
    grace = GRACE_PERIOD_SECONDS[spec.capacity_type]
    return {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(grace), "OMPI_MCA_odls_base_sigkill_timeout": str(grace // 3)}


MPI_KINDS = ("mpijob", "volcanojob")


def rank_grace_seconds(spec: JobSpec) -> int:
    """How long a training process has from its SIGTERM to its SIGKILL: the pod's grace under torchrun (which
    forwards at once and waits TORCH_ELASTIC_SHUTDOWN_TIMEOUT) and Ray (RAY_JOB_STOP_WAIT_TIME_S), a third of it
    under mpirun, which forwards a third in and SIGKILLs a third later (``shutdown_env``)."""
    grace = GRACE_PERIOD_SECONDS[spec.capacity_type]
    return grace // 3 if spec.kind in MPI_KINDS else grace


def job_contract(spec: JobSpec) -> dict[str, str]:
    """The contract's variables for the job of ``spec``, the same in every kind (``contract_env``)."""
    return contract_env(spec.name, spec.team, spec.checkpoint_uri, rank_grace_seconds(spec), spec.data_uri)


def trainer_env(spec: JobSpec) -> dict[str, str]:
    """NCCL (and EFA) settings on GPU jobs, the launchers' shutdown timeouts, the contract, then the spec's own env,
    which wins."""
    env = network_env(bool(spec.gpus_per_node), bool(spec.efa_devices), spec.node_group)
    env.update(shutdown_env(spec))
    env.update(job_contract(spec))
    env.update(spec.env)
    return env


def env_list(env: dict[str, str]) -> list[dict[str, str]]:
    return [{"name": name, "value": value} for name, value in env.items()]


def _quantity_cpu(cpu: float) -> str:
    return str(int(cpu)) if float(cpu).is_integer() else f"{max(1, round(cpu * 1000))}m"


def trainer_resources(spec: JobSpec) -> dict:
    """Guaranteed QoS: requests = limits, GPUs and EFA devices included; EFA pods on managed node groups
    also reserve libfabric's huge pages (Karpenter cannot size nodes for them: gpuyard.infra.conventions)."""
    amounts = {"cpu": _quantity_cpu(spec.cpu), "memory": f"{spec.memory_gib}Gi"}
    if spec.gpus_per_node:
        amounts[GPU_RESOURCE] = str(spec.gpus_per_node)
    if spec.efa_devices:
        amounts[EFA_RESOURCE] = str(spec.efa_devices)
        if spec.node_group:
            amounts[HUGEPAGES_RESOURCE] = HUGEPAGES_EFA
    return {"requests": dict(amounts), "limits": dict(amounts)}


def helper_resources() -> dict:
    amounts = {"cpu": HELPER_CPU, "memory": f"{HELPER_MEMORY_GIB}Gi"}
    return {"requests": dict(amounts), "limits": dict(amounts)}


def container(
    name: str,
    image: str,
    resources: dict,
    *,
    command: list[str] | None = None,
    args: list[str] | None = None,
    env: dict[str, str] | None = None,
    ports: list[dict] | None = None,
) -> dict:
    """A container with /dev/shm mounted; empty fields are left out."""
    out: dict = {"name": name, "image": image}
    if command:
        out["command"] = command
    if args:
        out["args"] = args
    if env:
        out["env"] = env_list(env)
    if ports:
        out["ports"] = ports
    out["resources"] = resources
    out["securityContext"] = container_security()
    out["volumeMounts"] = [{"name": SHM_VOLUME, "mountPath": SHM_PATH}]
    return out


def metrics_port() -> dict:
    return {"name": METRICS_PORT_NAME, "containerPort": METRICS_PORT, "protocol": "TCP"}


def gpu_tolerations(spec: JobSpec) -> list[dict]:
    if not spec.gpus_per_node:
        return []
    return [{"key": GPU_TAINT_KEY, "operator": "Equal", "value": GPU_TAINT_VALUE, "effect": GPU_TAINT_EFFECT}]


def trainer_node_selector(spec: JobSpec) -> dict[str, str]:
    """A managed node group by its label, or a NodePool and capacity type, pinned to one instance family."""
    selector = node_selector(spec.node_pool, spec.capacity_type, node_group=spec.node_group)
    if spec.instance_family:
        selector[LABEL_INSTANCE_FAMILY] = spec.instance_family
    return selector


def shm_volume(memory_gib: int) -> dict:
    """/dev/shm in RAM for NCCL and DataLoader workers, up to half the pod's memory."""
    return {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": f"{max(1, memory_gib // 2)}Gi"}}


def _pod_template(
    spec: JobSpec,
    team: Team,
    component: str,
    containers: list[dict],
    *,
    selector: dict[str, str],
    tolerations: list[dict],
    shm_gib: int,
    scheduler_name: str | None,
    restart_policy: str | None,
    extra_labels: dict[str, str] | None,
) -> dict:
    pod: dict = {"serviceAccountName": team.service_account, "priorityClassName": team.priority_class,
                 "terminationGracePeriodSeconds": GRACE_PERIOD_SECONDS[spec.capacity_type]}
    if scheduler_name:
        pod["schedulerName"] = scheduler_name
    if restart_policy:
        pod["restartPolicy"] = restart_policy
    pod["nodeSelector"] = selector
    if tolerations:
        pod["tolerations"] = tolerations
    pod["securityContext"] = pod_security()
    pod["containers"] = containers
    pod["volumes"] = [shm_volume(shm_gib)]
    return {
        "metadata": {
            "labels": {**labels(spec, component), **(extra_labels or {})},
            "annotations": {ANNOTATION_DO_NOT_DISRUPT: "true"},
        },
        "spec": pod,
    }


def trainer_pod(
    spec: JobSpec,
    team: Team,
    component: str,
    trainer: dict,
    *,
    scheduler_name: str | None = None,
    restart_policy: str | None = None,
    extra_labels: dict[str, str] | None = None,
) -> dict:
    """A pod template for a training node of ``spec`` running the ``trainer`` container."""
    return _pod_template(
        spec, team, component, [trainer],
        selector=trainer_node_selector(spec),
        tolerations=gpu_tolerations(spec),
        shm_gib=spec.memory_gib,
        scheduler_name=scheduler_name,
        restart_policy=restart_policy,
        extra_labels=extra_labels,
    )


def helper_pod(
    spec: JobSpec,
    team: Team,
    component: str,
    helper: dict,
    *,
    scheduler_name: str | None = None,
    restart_policy: str | None = None,
    extra_labels: dict[str, str] | None = None,
) -> dict:
    """A pod template for a coordinating CPU pod (launcher, head) of ``spec``."""
    return _pod_template(
        spec, team, component, [helper],
        selector=node_selector(NODEPOOL_CPU, "on-demand"),
        tolerations=[],
        shm_gib=HELPER_MEMORY_GIB,
        scheduler_name=scheduler_name,
        restart_policy=restart_policy,
        extra_labels=extra_labels,
    )
