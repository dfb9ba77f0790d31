"""Names the cluster and the job templates must agree on, defined once.

The infrastructure creates taints, NodePools, queues and monitors with these; the
renderers put the matching tolerations, selectors, labels and ports on training pods.
"""

GPU_RESOURCE = "nvidia.com/gpu"
EFA_RESOURCE = "vpc.amazonaws.com/efa"

# Taint on every GPU node (managed groups and Karpenter NodePools); pods tolerate it.
GPU_TAINT_KEY = GPU_RESOURCE
GPU_TAINT_VALUE = "true"
GPU_TAINT_EFFECT = "NoSchedule"

# On every GPU node (managed groups and NodePools): the NVIDIA device plugin chart 0.17.4 and the DCGM
# exporter select it (NVIDIA/k8s-device-plugin, deployments/helm/nvidia-device-plugin/values.yaml, default
# ``affinity``). NFD is not installed and AL2023's nodeadm sets it only from kubelet 1.35
# (awslabs/amazon-eks-ami, nodeadm/internal/kubelet/config.go), so the stack labels GPU nodes itself.
LABEL_GPU_PRESENT = "nvidia.com/gpu.present"
# On every node with EFA interfaces: the EFA device plugin's node selector (aws/eks-charts,
# stable/aws-efa-k8s-device-plugin); neither managed node groups nor Karpenter set it.
LABEL_EFA_PRESENT = "vpc.amazonaws.com/efa.present"
# EFA pods reserve 2 MiB huge pages for libfabric, as the AWS EKS user guide's EFA example does
# (docs.aws.amazon.com/eks/latest/userguide/node-efa.html: ``hugepages-2Mi: 5120Mi``). Karpenter cannot size a
# node for huge pages (kubernetes-sigs/karpenter#751, aws/karpenter-provider-aws#3315), so only pods on managed
# EFA node groups request them; on Karpenter's EFA pool libfabric falls back to regular pages.
HUGEPAGES_RESOURCE = "hugepages-2Mi"
HUGEPAGES_EFA = "5120Mi"
# What each managed EFA node reserves for them (infra/cluster.py efa_hugepages_script): the EKS user guide's figure
# (latest/ug/ml/node-efa.adoc, 5128 pages of 2 MiB, 10 GiB), twice one EFA pod's request.
HUGEPAGES_EFA_NODE_PAGES = 5128

# Karpenter NodePools and the node labels that select them.
NODEPOOL_GPU_ON_DEMAND = "gpu-on-demand"
NODEPOOL_GPU_SPOT = "gpu-spot"
NODEPOOL_GPU_EFA = "gpu-efa"
NODEPOOL_CPU = "cpu"
LABEL_NODE_GROUP = "gpuyard.io/node-group"
LABEL_INSTANCE_TYPE = "node.kubernetes.io/instance-type"
LABEL_INSTANCE_FAMILY = "karpenter.k8s.aws/instance-family"
LABEL_NODEPOOL = "karpenter.sh/nodepool"
LABEL_CAPACITY_TYPE = "karpenter.sh/capacity-type"
ANNOTATION_DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"


def node_selector(node_pool: str, capacity_type: str, *, node_group: bool = False) -> dict[str, str]:
    """The nodes of a managed node group by its label, or of a NodePool with one capacity type."""
    if node_group:
        return {LABEL_NODE_GROUP: node_pool}
    return {LABEL_NODEPOOL: node_pool, LABEL_CAPACITY_TYPE: capacity_type}


# Gang scheduling.
SCHEDULER_NAME = "volcano"
# Volcano queue of a pod (volcano.sh/apis, pkg/apis/scheduling/v1beta1/labels.go QueueNameAnnotationKey). On a
# namespace it is that namespace's queue: Volcano's PodGroup webhook puts a PodGroup naming the ``default`` queue
# there instead (volcano-sh/volcano v1.15.1 pkg/webhooks/admission/podgroups/mutate/mutate_podgroup.go).
ANNOTATION_QUEUE_NAME = "scheduling.volcano.sh/queue-name"
# Queue label and annotation of the Volcano Job controller (pkg/controllers/job/job_controller_util.go, batch
# QueueNameKey) and KubeRay's queue label (ray-operator/controllers/ray/batchscheduler/volcano/volcano_scheduler.go).
LABEL_QUEUE_NAME = "volcano.sh/queue-name"
# Queues Volcano creates itself (v1.15.1 pkg/scheduler/cache/cache.go, newDefaultAndRootQueue): never a team's.
RESERVED_QUEUES = ("default", "root")
# Namespaces that are never a team's: Kubernetes' own (``kube-*``, ``default``) and every namespace the stack
# installs software into (tests/test_contracts_tenancy.py checks the plan uses no other).
RESERVED_NAMESPACE_PREFIX = "kube-"
RESERVED_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease", "volcano-system",
                       "volcano-monitoring", "kubeflow", "kubeflow-system", "mpi-operator", "kuberay-system",
                       "monitoring", "nvidia-device-plugin")
# A team namespace carries one label per PriorityClass its pods and PodGroups may use (the admission policies read
# them, infra/admission.py): ``priority-class.gpuyard.io/gpuyard-low: allowed``.
LABEL_PRIORITY_CLASS_PREFIX = "priority-class.gpuyard.io/"
# Kubeflow Trainer v2: each team's namespaced TrainingRuntime for torchrun jobs (infra/trainer_runtime.py).
TRAINING_RUNTIME = "torch-distributed"


def runtime_name(pool: str) -> str:
    """The team's runtime for ``pool`` (one per pool): the on-demand GPU NodePool's is the plain ``torch-distributed``."""
    return TRAINING_RUNTIME if pool == NODEPOOL_GPU_ON_DEMAND else f"{TRAINING_RUNTIME}-{pool}"

PRIORITY_CLASSES = {"gpuyard-high": 100000, "gpuyard-normal": 10000, "gpuyard-low": 1000}

# What every training process of a gpuyard job finds in its environment, the same in every kind and on the Kubeflow
# SDK's path (the team's TrainingRuntimes): a user's script reads these instead of flags, so one script runs under any
# launcher; the reference trainer gets the same values as arguments.
ENV_JOB_NAME = "GPUYARD_JOB_NAME"  # the job object's name, unique per submission by default
ENV_TEAM = "GPUYARD_TEAM"  # the team whose namespace, queue and checkpoint prefix the job uses
ENV_CHECKPOINT_URI = "GPUYARD_CHECKPOINT_URI"  # s3://<bucket>/<team's prefix><job name>: the job's own folder
ENV_GRACE_PERIOD_SECONDS = "GPUYARD_GRACE_PERIOD_SECONDS"  # from this process's SIGTERM to its SIGKILL
ENV_METRICS_PORT = "GPUYARD_METRICS_PORT"  # the pod's scraped metrics port, for one process per pod
ENV_DATA_URI = "GPUYARD_DATA_URI"  # s3://<bucket>/<team's data prefix>: the team's data, which its role may read
CONTRACT_VARIABLES = (ENV_JOB_NAME, ENV_TEAM, ENV_CHECKPOINT_URI, ENV_GRACE_PERIOD_SECONDS, ENV_METRICS_PORT,
                      ENV_DATA_URI)

# On every GPU training pod: NCCL's warnings in the logs and its errors raised rather than hung on.
NCCL_ENV = {"NCCL_DEBUG": "WARN", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
# EFA jobs fail fast instead of training over TCP sockets. NCCL_NET names the network NCCL must use; when it
# cannot load it, NCCL fails instead of falling back to its socket transport (NCCL user guide, env.html
# #nccl-net). "AWS Libfabric" is the name aws-ofi-nccl registers; FI_PROVIDER=efa restricts libfabric to the
# EFA provider, so a node without EFA devices fails at init too. GPUDirect RDMA where the instance has it.
EFA_ENV = {
    "NCCL_NET": "AWS Libfabric",
    "FI_PROVIDER": "efa",
    "FI_EFA_USE_DEVICE_RDMA": "1",
    "FI_EFA_FORK_SAFE": "1",
}
# Karpenter nodes reserve no huge pages (HUGEPAGES_EFA): libfabric uses regular pages there.
EFA_NO_HUGE_PAGES_ENV = {"FI_EFA_USE_HUGE_PAGE": "0"}


def contract_env(job: str, team: str, checkpoint_uri: str, grace_seconds: int, data_uri: str) -> dict[str, str]:
    """The contract's variables (``CONTRACT_VARIABLES``, in that order) for one job: what ``gpuyard render`` gives
    every kind's trainer and the team's TrainingRuntimes give an SDK's TrainJob."""
    return {ENV_JOB_NAME: job, ENV_TEAM: team, ENV_CHECKPOINT_URI: checkpoint_uri,
            ENV_GRACE_PERIOD_SECONDS: str(grace_seconds), ENV_METRICS_PORT: str(METRICS_PORT), ENV_DATA_URI: data_uri}


def network_env(gpus: bool, efa: bool, node_group: bool) -> dict[str, str]:
    """NCCL's settings on GPU pods, EFA's on EFA pods (huge pages off on Karpenter's nodes, which reserve none)."""
    env = dict(NCCL_ENV) if gpus else {}
    if efa:
        env.update(EFA_ENV)
        if not node_group:
            env.update(EFA_NO_HUGE_PAGES_ENV)
    return env
# /dev/shm in memory on every training pod, for NCCL and DataLoader workers.
SHM_VOLUME = "dshm"
SHM_PATH = "/dev/shm"

# Labels on every training pod; the PodMonitor selects on them.
LABEL_TEAM = "gpuyard.io/team"
LABEL_JOB = "gpuyard.io/job"
LABEL_PART_OF = "app.kubernetes.io/part-of"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
PART_OF = "gpuyard"

# The trainer's Prometheus endpoint (rank 0), scraped through a named container port.
METRICS_PORT = 9464
METRICS_PORT_NAME = "metrics"

# Container images built from images/<name>/Dockerfile, one ECR repository each.
IMAGE_NAMES = ("ddp", "mpi", "ray")

# AWS tag on every resource the Pulumi stack creates (provider default_tags, value: the stack name).
# `gpuyard env cleanup` deletes what Kubernetes and Karpenter left for a cluster and never a resource with this tag.
TAG_STACK = "gpuyard.io/stack"

# Training pods pass the Pod Security Standard ``restricted`` that team namespaces enforce (kubernetes/
# pod-security-admission, policy/check_runAsNonRoot.go, check_seccompProfile_restricted.go,
# check_allowPrivilegeEscalation.go, check_capabilities_restricted.go). The non-root user of the gpuyard images
# (images/*: uid 1000, the Ray base's ``ray`` user too); fsGroup makes mounted secrets and tokens readable.
RUN_AS_USER = 1000


def pod_security() -> dict:
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "fsGroup": RUN_AS_USER,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security() -> dict:
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}

# terminationGracePeriodSeconds, and the trainer's --grace-period, per capacity type: a spot instance gets two
# minutes' notice (EC2 spot interruption notice, SPOT_NOTICE_SECONDS; Karpenter drains on it), less a margin for
# the drain to reach the pod; an on-demand node is drained for consolidation or replacement, without a hard
# deadline, so a large checkpoint gets longer. The NodePools' terminationGracePeriod agrees (infra/karpenter.py).
SPOT_NOTICE_SECONDS = 120
GRACE_PERIOD_SECONDS: dict[str, int] = {"spot": 90, "on-demand": 300}

# The trainer's exit statuses, which every kind's retry rule reads (jobs/render/*, infra/trainer_runtime.py):
# 143 (128 + SIGTERM) "stopped or lost a peer: run me again", 1 "the loss or weights went non-finite" and 2 "another
# run holds the checkpoint prefix, or the arguments do not match its checkpoints" are final (a rerun fails alike).
# The Training Operator's ExitCode policy retries 128-255 and never 1-127 (kubeflow/training-operator v1.9.0,
# pkg/util/train/train_util.go IsRetryableExitCode): every status a launcher returns for a signal is retried.
EXIT_NONFINITE = 1
EXIT_CONFLICT = 2
EXIT_RETRYABLE = 143
FINAL_EXIT_CODES = (EXIT_NONFINITE, EXIT_CONFLICT)
# What an MPI launcher writes (its pod's log) each time it reruns mpirun after a retryable status
# (gpuyard.jobs.workload.launch), which `gpuyard status` counts as a restart
LAUNCH_RERUN = "retryable: running it again"
# How often a job is rerun after a retryable exit, unless a template says otherwise (the TrainJob API has none: its
# team's TrainingRuntime carries this one).
DEFAULT_MAX_RESTARTS = 3
