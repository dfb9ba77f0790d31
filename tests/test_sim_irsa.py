"""IRSA's stand-in in the simulated cluster (sim/irsa.py): a MutatingAdmissionPolicy and binding per ServiceAccount
of the stack that names an IAM role, passing the official schemas. What a pod gets from them is tested on the sim's
real nodes (tests/test_sim_real_gang.py: the pods' variables and token, checkpoints written with no keys given)."""

import subprocess
import sys

import pytest
import yaml

from gpuyard.infra.config import load_stack
from gpuyard.infra.plan import plan
from gpuyard.sim import irsa, stack

ENDPOINT = "http://10.244.0.1:443"


@pytest.fixture(scope="module")
def objects():
    return stack.kubernetes_objects(plan("dev").resources)


def test_each_team_service_account_gets_a_policy_with_its_role_namespace_and_name(objects):
    config = load_stack("dev")
    policies = irsa.policies(objects, config.region, ENDPOINT)
    kinds = [p["kind"] for p in policies]
    assert kinds == ["MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"] * len(config.teams), kinds
    roles = {(o["metadata"]["namespace"], o["metadata"]["name"]): o["metadata"]["annotations"][irsa.ROLE_ANNOTATION]
             for o in objects if o["kind"] == "ServiceAccount" and irsa.ROLE_ANNOTATION in o["metadata"].get(
                 "annotations", {})}
    by_namespace = {p["spec"]["matchConstraints"]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]: p
                    for p in policies[::2]}
    assert sorted(by_namespace) == sorted(team.namespace for team in config.teams), sorted(by_namespace)
    for team in config.teams:
        spec = by_namespace[team.namespace]["spec"]
        assert f"== '{team.service_account}'" in spec["matchConditions"][0]["expression"]
        applied = spec["mutations"][1]["applyConfiguration"]["expression"]
        role = roles[(team.namespace, team.service_account)]
        assert f'"value": "{role}"' in applied and f'"value": "{ENDPOINT}"' in applied, (role, applied)


def test_the_variables_are_the_pod_identity_webhooks_and_the_sims_endpoint():
    env = irsa.injected_env("arn:aws:iam::123456789012:role/r", "us-west-2", ENDPOINT)
    assert env == {"AWS_STS_REGIONAL_ENDPOINTS": "regional", "AWS_DEFAULT_REGION": "us-west-2",
                   "AWS_REGION": "us-west-2", "AWS_ROLE_ARN": "arn:aws:iam::123456789012:role/r",
                   "AWS_WEB_IDENTITY_TOKEN_FILE": "/var/run/secrets/eks.amazonaws.com/serviceaccount/token",
                   "AWS_ENDPOINT_URL": ENDPOINT}


def test_the_policies_pass_strict_validation(objects, validate_manifests, tmp_path):
    path = tmp_path / "irsa.yaml"
    path.write_text(yaml.safe_dump_all(irsa.policies(objects, "us-west-2", ENDPOINT)))
    result = subprocess.run([sys.executable, str(validate_manifests), "--strict", str(path)], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0 and "4 passed, 0 failed" in result.stdout, result.stdout + result.stderr
