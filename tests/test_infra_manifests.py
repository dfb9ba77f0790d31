"""Every Kubernetes object the program creates passes the official schemas (../shared/tools/validate-manifests --strict)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from infra_plans import kubernetes_manifests, planned

CUSTOM_KINDS = {"NodePool", "EC2NodeClass", "Queue", "PodMonitor", "TrainingRuntime"}


@pytest.mark.parametrize("stack", ["dev", "prod", "ephemeral"])
def test_kubernetes_objects_pass_strict_validation(stack, validate_manifests, tmp_path):
    manifests = kubernetes_manifests(planned(stack))
    kinds = {m["kind"] for m in manifests}
    assert CUSTOM_KINDS - {"TrainingRuntime"} <= kinds
    path = tmp_path / f"{stack}.yaml"
    path.write_text(yaml.safe_dump_all(manifests, sort_keys=True))
    result = subprocess.run(
        [sys.executable, str(validate_manifests), "--strict", str(path)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(manifests)} passed, 0 failed" in result.stdout


def test_dev_creates_every_custom_kind():
    assert CUSTOM_KINDS <= {m["kind"] for m in kubernetes_manifests(planned("dev"))}
