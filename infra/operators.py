"""How the schedulers and operators are configured: the one place the stack and the simulated cluster read.

Each value is a contract between a controller and the manifests gpuyard renders; the upstream source of
each is cited next to it. ``infra/addons.py`` and ``infra/manifests/`` install them, and the contract tests
(``tests/test_contracts_*.py``) check that what the stack installs carries them.
"""

from __future__ import annotations

from pathlib import Path

# Volcano scheduler configuration (volcano-sh/volcano v1.15.1; the plugin sources cited are v1.14.1, the version
# the simulated cluster runs):
#
# The chart's default, installer/helm/chart/volcano/config/volcano-scheduler.conf, runs the actions
# "enqueue, reserve, allocate, backfill". ``enqueue`` (with the overcommit and proportion plugins) admits a
# PodGroup (Pending -> Inqueue) only when the cluster's *present* idle capacity times the overcommit factor
# covers its minResources. The Volcano Job controller and the Training Operator create no pods for a Pending
# PodGroup (volcano v1.14.1 pkg/controllers/job/job_controller_actions.go syncJob; kubeflow/training-operator v1.9.4
# pkg/controller.v1/control/podgroup_control.go DelayPodCreationDueToPodGroup), and Karpenter only acts on pods
# the scheduler marked Unschedulable, so a gang that needs nodes that do not exist yet waits forever and the GPU
# pools never scale up from zero (volcano-sh/volcano#3910, #2558, #4030; kubernetes-sigs/karpenter#742). The
# maintainers' advice in #3910: drop ``enqueue``.
#
# Without ``enqueue`` the ``allocate`` action moves every Pending PodGroup to Inqueue itself ("status update
# from pending to inqueue, reason: no enqueue action is configured", pkg/scheduler/actions/allocate/
# allocate.go), the pods are created, the gang that does not fit stays Unschedulable, and Karpenter
# provisions for it. ``overcommit`` only feeds ``enqueue`` and is left out. So every gang's pods exist as soon as it
# is submitted, and a team's compute limit is its queue's capability, not a ResourceQuota (infra/tenancy.py
# team_quota).
#
# ``capacity`` in place of the chart's ``proportion``: proportion lets a queue allocate only within its deserved
# share, which it computes from the queue weights over the resources of the nodes *present*
# (pkg/scheduler/plugins/proportion/proportion.go, queueAllocatable). With GPU nodes made on demand two teams
# whose gangs each need the whole capped pool both deserve less than a gang, and neither ever runs (the
# simulated cluster showed it: vision 5.33 and nlp 2.67 of 8 GPUs against gangs of 8). capacity lets a queue
# allocate up to its ``realCapability``, its capability bounded by the cluster's resources
# (pkg/scheduler/plugins/capacity/capacity.go, buildQueueAttrs and queueAllocatable), so one gang runs whole
# and the other waits whole. The team's weight lives on in the Queue's ``deserved``, its weighted share of the
# GPU pool (infra/tenancy.py deserved_gpus): capacity orders queues by allocated / deserved, and ``reclaim``
# takes back from a queue above its deserved share for a starved one (Reclaimable and Preemptive in
# capacity.go), which makes a Queue's ``reclaimable: true`` mean something; the evictions are committed only when
# the starved gang can then be placed whole (pkg/scheduler/actions/reclaim/reclaim.go, JobPipelined).
#
# ``preempt`` lets a higher PriorityClass (gpuyard-high over gpuyard-low) evict lower-priority pods in the
# same queue (``priority`` plugin); #3910 notes ``enqueue`` and ``preempt``
# do not work together, one more reason to drop ``enqueue``. ``gang`` keeps all-or-nothing placement; the
# tiers are the chart's default otherwise (``reservation`` goes with the ``reserve`` action, left out).
VOLCANO_ACTIONS = ("allocate", "backfill", "preempt", "reclaim")
VOLCANO_SCHEDULER_CONF = f"""\
actions: "{', '.join(VOLCANO_ACTIONS)}"
tiers:
- plugins:
  - name: priority
  - name: gang
    enablePreemptable: false
  - name: conformance
- plugins:
  - name: drf
    enablePreemptable: false
  - name: predicates
  - name: capacity
  - name: nodeorder
  - name: binpack
"""

# The volcano chart (installer/helm/chart/volcano/values.yaml and templates/scheduler.yaml, v1.15.1) writes
# ``custom.scheduler_config_override`` verbatim into the scheduler ConfigMap's volcano-scheduler.conf, the
# file the scheduler reads (--scheduler-conf=/volcano.scheduler/volcano-scheduler.conf).
VOLCANO_SCHEDULER_CONF_VALUES_KEY = ("custom", "scheduler_config_override")

# Kubeflow Training Operator v1.9.4 (kubeflow/training-operator, cmd/training-operator.v1/main.go): create a
# Volcano PodGroup per job (runPolicy.schedulingPolicy carries queue and priority); every scheme but MPIJob,
# whose CRD the MPI Operator serves; PyTorchJob workers get the init container of PYTORCH_INIT_TEMPLATE (upstream's
# default template plus the restricted securityContext; --pytorch-init-container-template-file, read by
# pkg/controller.v1/pytorch/initcontainer.go). Set by the patch in infra/manifests/training-operator, which mounts
# the template from a ConfigMap at PYTORCH_INIT_TEMPLATE_PATH.
PYTORCH_INIT_TEMPLATE = Path(__file__).parent / "manifests" / "training-operator" / "pytorch-init-container.yaml"
PYTORCH_INIT_TEMPLATE_PATH = "/etc/gpuyard/pytorch-init/initContainer.yaml"
PYTORCH_INIT_TEMPLATE_FLAG = "--pytorch-init-container-template-file"
TRAINING_OPERATOR_ARGS = (
    "--gang-scheduler-name=volcano",
    "--enable-scheme=tfjob",
    "--enable-scheme=pytorchjob",
    "--enable-scheme=xgboostjob",
    "--enable-scheme=paddlejob",
    "--enable-scheme=jaxjob",
    f"{PYTORCH_INIT_TEMPLATE_FLAG}={PYTORCH_INIT_TEMPLATE_PATH}",
)

# MPI Operator v0.8.0 (kubeflow/mpi-operator, cmd/mpi-operator/app/options/options.go): without
# --gang-scheduling=volcano it creates no PodGroup and ignores runPolicy.schedulingPolicy. The released
# Deployment (deploy/v2beta1/mpi-operator.yaml) runs "-alsologtostderr --lock-namespace=mpi-operator" only;
# the patch in infra/manifests/mpi-operator replaces them with these.
MPI_OPERATOR_ARGS = ("-alsologtostderr", "--lock-namespace=mpi-operator", "--gang-scheduling=volcano")

# KubeRay v1.7.0: the kuberay-operator chart (helm-chart/kuberay-operator/templates/deployment.yaml) turns
# ``batchScheduler.name`` into --batch-scheduler=<name>; with it the operator creates a Volcano PodGroup per
# RayCluster, taking the queue from the ``volcano.sh/queue-name`` label and the priority from the pods'
# priorityClassName (ray-operator/controllers/ray/batchscheduler/volcano/volcano_scheduler.go).
KUBERAY_BATCH_SCHEDULER = "volcano"
KUBERAY_OPERATOR_ARGS = (f"--batch-scheduler={KUBERAY_BATCH_SCHEDULER}",)

# Kubeflow Trainer v2.3.0 has no controller flag for Volcano: its Volcano plugin
# (pkg/runtime/framework/plugins/volcano/volcano.go) acts for runtimes with ``podGroupPolicy.volcano``. It
# sets no schedulerName, reads the queue from the runtime template's ``scheduling.volcano.sh/queue-name``
# annotation and the priority from the pod template's priorityClassName; infra/trainer_runtime.py writes all
# three into each team's TrainingRuntime.
TRAINER_PODGROUP_POLICY = {"volcano": {}}
