"""GPUs only to pods that request them, on every GPU node (managed node groups and Karpenter's alike).

With the NVIDIA device plugin's default ``deviceListStrategy: envvar`` (NVIDIA/k8s-device-plugin v0.17.4,
cmd/nvidia-device-plugin/main.go, ``device-list-strategy``) a container's GPUs are whatever its
``NVIDIA_VISIBLE_DEVICES`` says, and the NVIDIA container toolkit honours that variable from unprivileged containers
(NVIDIA/nvidia-container-toolkit v1.18.2, internal/config/config.go: ``AcceptEnvvarUnprivileged`` true by default).
EKS's AL2023 NVIDIA AMI makes the toolkit's runtime containerd's default for every pod (awslabs/amazon-eks-ami
v20260724, nodeadm/internal/containerd/runtime_config_nvidia.go), so a pod that requests no GPU and sets
``NVIDIA_VISIBLE_DEVICES=all`` (or runs an image that sets it) gets every GPU of the node.

So the device plugin hands a container its GPUs as volume mounts under ``/var/run/nvidia-container-devices``
(v0.17.4 internal/plugin/server.go, ``deviceListAsVolumeMountsContainerPathRoot``), which a pod cannot forge
(admission refuses hostPath volumes in team namespaces), and every GPU node's toolkit accepts only those:
``accept-nvidia-visible-devices-envvar-when-unprivileged = false`` and
``accept-nvidia-visible-devices-as-volume-mounts = true`` in ``/etc/nvidia-container-runtime/config.toml``, set with
``nvidia-ctk config --in-place --set`` (cmd/nvidia-ctk/config/config.go, v1.17.0 on). The admission policy also
refuses ``NVIDIA_VISIBLE_DEVICES`` in team pods (infra/admission.py); an image's own ENV it cannot see.

The node script runs from user data: AL2023 runs user-data shell scripts (cloud-final) before ``nodeadm-run``
starts the kubelet (amazon-eks-ami templates/al2023/runtime/rootfs/etc/systemd/system/nodeadm-run.service), so no
pod starts before the toolkit is set. Managed node groups take MIME multi-part user data, merged with EKS's own
(awsdocs/amazon-eks-user-guide, latest/ug/nodes/launch-templates.adoc); Karpenter v1.14.1 merges an AL2023
EC2NodeClass's ``userData`` shell script with its NodeConfig (website/content/en/docs/concepts/nodeclasses.md,
spec.userData, AL2023). The EC2NodeClass serves CPU NodePools too: the script does nothing where the toolkit is
absent, which is also where no container can reach a GPU through it.
"""

from __future__ import annotations


DEVICE_LIST_STRATEGY = "volume-mounts"
TOOLKIT_SETTINGS = {
    "accept-nvidia-visible-devices-envvar-when-unprivileged": "false",
    "accept-nvidia-visible-devices-as-volume-mounts": "true",
}


def toolkit_script() -> str:
    """The node script: the container toolkit takes a container's GPUs from the device plugin's mounts only."""
    sets = " ".join(f"--set {key}={value}" for key, value in TOOLKIT_SETTINGS.items())
    return (
        "#!/bin/bash\n"
        "# gpuyard: GPUs only to pods that request them (infra/gpu_access.py)\n"
        "set -euo pipefail\n"
        "if command -v nvidia-ctk >/dev/null; then\n"
        f"  nvidia-ctk config --in-place {sets}\n"
        "fi\n"
    )
