"""Contract: on every stack's plan, GPUs go only to pods that request them (device plugin strategy and the container
toolkit setting on every GPU node, managed and Karpenter's), no team can take an operator's namespace, and team S3
grants end at '/' (issue 21). Upstream facts are cited in infra/gpu_access.py."""

from __future__ import annotations

import base64
import email
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gpuyard.infra.config import load_stack
from gpuyard.infra.conventions import RESERVED_NAMESPACE_PREFIX, RESERVED_NAMESPACES
from gpuyard.infra.gpu_access import TOOLKIT_SETTINGS, toolkit_script
from infra_plans import of_type, planned

STACKS = ("dev", "prod", "ephemeral")
MANIFESTS = Path(__file__).parent.parent / "infra" / "manifests"
# NVIDIA/nvidia-container-toolkit v1.18.2 internal/config/config.go: the TOML keys of AcceptEnvvarUnprivileged and
# AcceptDeviceListAsVolumeMounts, and what they must be for the device plugin's volume-mounts strategy.
TOOLKIT_KEYS = {"accept-nvidia-visible-devices-envvar-when-unprivileged": "false",
                "accept-nvidia-visible-devices-as-volume-mounts": "true"}


def _sets(script: str) -> dict[str, str]:
    (command,) = [line for line in script.splitlines() if "nvidia-ctk config" in line]
    assert "--in-place" in command.split()
    return dict(match.split("=", 1) for match in re.findall(r"--set (\S+)", command))


@pytest.mark.parametrize("stack", STACKS)
def test_the_device_plugin_hands_out_gpus_as_volume_mounts(stack):
    (plugin,) = [r for r in of_type(planned(stack), "kubernetes:helm.sh/v3:Release")
                 if r.inputs["chart"] == "nvidia-device-plugin"]
    assert plugin.inputs["values"]["deviceListStrategy"] == "volume-mounts"


@pytest.mark.parametrize("stack", STACKS)
def test_every_managed_gpu_group_sets_the_toolkit_at_boot(stack):
    resources = planned(stack)
    templates = {r.urn: r for r in of_type(resources, "aws:ec2/launchTemplate:LaunchTemplate")}
    groups = [g for g in of_type(resources, "aws:eks/nodeGroup:NodeGroup") if g.inputs["amiType"].endswith("NVIDIA")]
    assert len(groups) == len(load_stack(stack).cluster.gpu_node_groups)
    for group in groups:
        (template,) = [templates[urn] for urn in group.property_dependencies["launchTemplate"]]
        archive = email.message_from_string(base64.b64decode(template.inputs["userData"]).decode())
        assert archive.is_multipart()  # EKS merges its own part into a MIME multi-part archive
        assert all(part.get_content_type() == "text/x-shellscript" for part in archive.get_payload())
        (script,) = [part.get_payload() for part in archive.get_payload() if "nvidia-ctk" in part.get_payload()]
        assert _sets(script) == TOOLKIT_KEYS, group.name
    system = [g for g in of_type(resources, "aws:eks/nodeGroup:NodeGroup") if not g.inputs["amiType"].endswith("NVIDIA")]
    assert all("userData" not in templates[g.property_dependencies["launchTemplate"][0]].inputs for g in system)


@pytest.mark.parametrize("stack", STACKS)
def test_every_karpenter_gpu_pool_boots_nodes_that_set_the_toolkit(stack):
    resources = planned(stack)
    classes = {c.inputs["metadata"]["name"]: c.inputs["spec"] for c in
               of_type(resources, "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass")}
    gpu_pools = [p.inputs["spec"]["template"] for p in of_type(resources, "kubernetes:karpenter.sh/v1:NodePool")
                 if "taints" in p.inputs["spec"]["template"]["spec"]]
    assert gpu_pools
    for pool in gpu_pools:
        node_class = classes[pool["spec"]["nodeClassRef"]["name"]]
        assert node_class["amiSelectorTerms"] == [{"alias": "al2023@latest"}]  # Karpenter merges AL2023 user data
        assert _sets(node_class["userData"]) == TOOLKIT_KEYS


def test_the_toolkit_settings_are_the_toolkits_keys():
    assert TOOLKIT_SETTINGS == TOOLKIT_KEYS


def test_the_node_script_is_valid_bash_and_a_no_op_without_the_toolkit(tmp_path):
    """A CPU node of the shared EC2NodeClass has no nvidia-ctk (nor NVIDIA runtime): the script does nothing there."""
    script = tmp_path / "gpu-access.sh"
    script.write_text(toolkit_script())
    subprocess.run(["bash", "-n", str(script)], check=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "bash").symlink_to(shutil.which("bash"))
    result = subprocess.run(["bash", str(script)], env={"PATH": str(bin_dir)}, capture_output=True, text=True)
    assert result.returncode == 0 and result.stderr == ""


def _installed_namespaces(stack: str) -> set[str]:
    resources = planned(stack)
    releases = {r.inputs["namespace"] for r in of_type(resources, "kubernetes:helm.sh/v3:Release")}
    objects = {r.inputs["metadata"].get("namespace") for r in resources
               if r.type.startswith("kubernetes:") and isinstance(r.inputs.get("metadata"), dict)}
    text = " ".join(path.read_text() for path in MANIFESTS.glob("*/kustomization.yaml"))
    kustomized = set(re.findall(r"(?:namespace: |--lock-namespace=)([a-z0-9-]+)", text))
    teams = {team.namespace for team in load_stack(stack).teams}
    return (releases | objects | kustomized) - teams - {None}


@pytest.mark.parametrize("stack", STACKS)
def test_every_namespace_the_stack_installs_into_is_reserved(stack):
    installed = _installed_namespaces(stack)
    assert {"kubeflow", "mpi-operator", "volcano-system", "kube-system"} <= installed
    assert {n for n in installed if n not in RESERVED_NAMESPACES and not n.startswith(RESERVED_NAMESPACE_PREFIX)} == set()


@pytest.mark.parametrize("stack", STACKS)
def test_team_s3_grants_end_at_a_slash(stack):
    for policy in of_type(planned(stack), "aws:iam/rolePolicy:RolePolicy"):
        for statement in json.loads(policy.inputs["policy"])["Statement"]:
            prefixes = statement.get("Condition", {}).get("StringLike", {}).get("s3:prefix", [])
            objects = [r for r in [statement["Resource"]] if str(r).startswith("arn:aws:s3:::") and "/" in str(r)]
            for pattern in prefixes + [o.split("/", 1)[1] for o in objects]:
                assert pattern.rstrip("*").endswith("/"), (policy.name, pattern)
