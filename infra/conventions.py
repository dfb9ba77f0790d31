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

# Karpenter NodePools and the node labels that select them.
NODEPOOL_GPU_ON_DEMAND = "gpu-on-demand"
NODEPOOL_GPU_SPOT = "gpu-spot"
NODEPOOL_CPU = "cpu"
LABEL_NODEPOOL = "karpenter.sh/nodepool"
LABEL_CAPACITY_TYPE = "karpenter.sh/capacity-type"
ANNOTATION_DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"

# Gang scheduling.
SCHEDULER_NAME = "volcano"
PRIORITY_CLASSES = {"gpuyard-high": 100000, "gpuyard-normal": 10000, "gpuyard-low": 1000}

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
