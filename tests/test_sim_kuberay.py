"""What `gpuyard sim up --real-nodes` applies for KubeRay's operator pod (sim/kuberay.py), checked without a cluster:
the objects pass strict validation, and the pod is upstream's with the sim's changes only. That it runs, and that
the team's NetworkPolicy decides its requests, is tests/test_sim_real_ray.py's."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
import yaml

from gpuyard.infra import operators
from gpuyard.infra.tenancy import KUBERAY_NAMESPACE
from gpuyard.sim import kuberay
from gpuyard.sim.addons import KUBERAY_MODULE
from gpuyard.sim.upstream import module_dir

pytestmark = pytest.mark.skipif(shutil.which("go") is None, reason="the KubeRay module comes from Go's module cache")


@pytest.fixture(scope="module")
def objects() -> list[dict]:
    return kuberay.manifests(module_dir("kuberay", KUBERAY_MODULE), "127.0.0.1:5000/gpuyard-sim/kuberay-operator:in-x",
                             "cpu-m7i-2xlarge-1", ("10.244.0.1", 6443))


def test_the_objects_pass_strict_validation(objects, validate_manifests, tmp_path):
    path = tmp_path / "kuberay.yaml"
    path.write_text(yaml.safe_dump_all(objects))
    result = subprocess.run([sys.executable, str(validate_manifests), "--strict", str(path)], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0 and "4 passed, 0 failed" in result.stdout, result.stdout + result.stderr


def test_the_pod_is_upstreams_in_the_stacks_namespace_with_the_stacks_flags(objects):
    account, role, binding, deployment = objects
    assert account["metadata"]["namespace"] == deployment["metadata"]["namespace"] == KUBERAY_NAMESPACE
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": KUBERAY_NAMESPACE}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert {"apiGroups": ["scheduling.volcano.sh"], "resources": ["podgroups"],
            "verbs": ["create", "delete", "get", "list", "update", "watch"]} in role["rules"]
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["args"] == [*operators.KUBERAY_OPERATOR_ARGS, "--enable-leader-election=false"]
    assert pod["securityContext"]["runAsNonRoot"] is True  # upstream's, kept: the image's user is 65532
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert "cpu" not in container["resources"]["requests"] and "cpu" not in container["resources"]["limits"]
    assert {e["name"]: e["value"] for e in container["env"]} == {"KUBERNETES_SERVICE_HOST": "10.244.0.1",
                                                                 "KUBERNETES_SERVICE_PORT": "6443"}
    assert pod["nodeSelector"] == {"kubernetes.io/hostname": "cpu-m7i-2xlarge-1"}
