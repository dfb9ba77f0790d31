"""IRSA in the simulated cluster: what EKS's pod identity webhook does to a pod whose ServiceAccount names an IAM
role, done by the API server's MutatingAdmissionPolicies, with STS and S3 answered by the sim's moto_server
(sim/s3.py), so a pod's boto3 gets its credentials as on EKS: AssumeRoleWithWebIdentity with its projected token.

For each ServiceAccount of the stack annotated ``eks.amazonaws.com/role-arn`` (infra/tenancy.py: each team's), its
pods get, in every container and init container, what amazon-eks-pod-identity-webhook v0.6.17 adds
(pkg/handler/handler.go ``addEnvToContainer``, main.go flags as EKS runs it): ``AWS_ROLE_ARN``,
``AWS_WEB_IDENTITY_TOKEN_FILE``, ``AWS_REGION``, ``AWS_DEFAULT_REGION`` and ``AWS_STS_REGIONAL_ENDPOINTS=regional``,
and the ``aws-iam-token`` projected ServiceAccount token (audience ``sts.amazonaws.com``, 86400 s) mounted read-only
at ``/var/run/secrets/eks.amazonaws.com/serviceaccount``. The one addition, which EKS has no need of, is
``AWS_ENDPOINT_URL``, the sim's endpoint (boto3 sends STS and S3 there). As the webhook, a variable the pod already
sets is left as it is (the webhook decides per group of variables, this per variable). moto does not check the token,
the role's trust policy or the role's S3 policy: what the team's role may do is tested against the plan
(tests/test_infra_specs.py), not here.

The policies are beta in Kubernetes 1.35 (``MutatingAdmissionPolicy`` feature gate, ``admissionregistration.k8s.io/
v1beta1``), which the sim's API server turns on (sim/controlplane.py); EKS runs the webhook instead.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from gpuyard.infra.conventions import SCHEDULER_NAME

ROLE_ANNOTATION = "eks.amazonaws.com/role-arn"
TOKEN_FOLDER = "/var/run/secrets/eks.amazonaws.com/serviceaccount"
VOLUME = "aws-iam-token"
AUDIENCE = "sts.amazonaws.com"
TOKEN_EXPIRATION_SECONDS = 86400  # pkg.DefaultTokenExpiration
API_VERSION = "admissionregistration.k8s.io/v1beta1"


def injected_env(role_arn: str, region: str, endpoint: str) -> dict[str, str]:
    """The variables a pod of a ServiceAccount with ``role_arn`` gets in the sim."""
    return {"AWS_STS_REGIONAL_ENDPOINTS": "regional", "AWS_DEFAULT_REGION": region, "AWS_REGION": region,
            "AWS_ROLE_ARN": role_arn, "AWS_WEB_IDENTITY_TOKEN_FILE": f"{TOKEN_FOLDER}/token",
            "AWS_ENDPOINT_URL": endpoint}


def _containers(field: str, env: dict[str, str]) -> str:
    """CEL: ``object.spec.<field>`` each given the variables it lacks and the token's mount (if it lacks one)."""
    literal = json.dumps([{"name": name, "value": value} for name, value in env.items()])
    kind = f"Object.spec.{field}"
    return (
        f"object.spec.{field}.map(c, {kind}{{name: c.name, "
        f"env: {literal}.filter(e, !has(c.env) || !c.env.exists(x, x.name == e.name))"
        f".map(e, {kind}.env{{name: e.name, value: e.value}}), "
        f"volumeMounts: has(c.volumeMounts) && c.volumeMounts.exists(m, m.name == '{VOLUME}') ? [] : "
        f"[{kind}.volumeMounts{{name: '{VOLUME}', mountPath: '{TOKEN_FOLDER}', readOnly: true}}]}})"
    )


def volume_patch() -> str:
    """CEL JSON patch: the token's projected volume, unless the pod has one of that name (a JSON patch: an apply
    configuration may not set the atomic list ``projected.sources``)."""
    projected = "Object.spec.volumes.projected"
    token = (f"{projected}.sources.serviceAccountToken{{audience: '{AUDIENCE}', "
             f"expirationSeconds: {TOKEN_EXPIRATION_SECONDS}, path: 'token'}}")
    volume = (f"Object.spec.volumes{{name: '{VOLUME}', projected: {projected}{{sources: "
              f"[{projected}.sources{{serviceAccountToken: {token}}}]}}}}")
    return (f"!has(object.spec.volumes) ? [JSONPatch{{op: 'add', path: '/spec/volumes', value: [{volume}]}}] : "
            f"object.spec.volumes.exists(v, v.name == '{VOLUME}') ? [] : "
            f"[JSONPatch{{op: 'add', path: '/spec/volumes/-', value: {volume}}}]")


def containers_apply(env: dict[str, str]) -> str:
    """CEL apply configuration: every container's and init container's variables and the token's mount."""
    return (
        "Object{spec: Object.spec{"
        f"containers: {_containers('containers', env)}, "
        f"initContainers: has(object.spec.initContainers) ? {_containers('initContainers', env)} : []"
        "}}"
    )


def policies(objects: Iterable[dict[str, Any]], region: str, endpoint: str) -> list[dict[str, Any]]:
    """A MutatingAdmissionPolicy and its binding per ServiceAccount in ``objects`` that names an IAM role."""
    out = []
    for account in objects:
        role = account.get("metadata", {}).get("annotations", {}).get(ROLE_ANNOTATION)
        if account.get("kind") != "ServiceAccount" or not role:
            continue
        namespace, name = account["metadata"]["namespace"], account["metadata"]["name"]
        policy = f"gpuyard-sim-irsa-{namespace}-{name}"
        out.append({"apiVersion": API_VERSION, "kind": "MutatingAdmissionPolicy", "metadata": {"name": policy}, "spec": {
            "failurePolicy": "Fail", "reinvocationPolicy": "Never",
            "matchConstraints": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                                   "resources": ["pods"]}]},
            "matchConditions": [{"name": "runs-as-the-service-account", "expression":
                                 f"has(object.spec.serviceAccountName) && object.spec.serviceAccountName == '{name}'"}],
            "mutations": [
                {"patchType": "JSONPatch", "jsonPatch": {"expression": volume_patch()}},
                {"patchType": "ApplyConfiguration", "applyConfiguration": {
                    "expression": containers_apply(injected_env(role, region, endpoint))}}]}})
        out.append({"apiVersion": API_VERSION, "kind": "MutatingAdmissionPolicyBinding", "metadata": {"name": policy},
                    "spec": {"policyName": policy}})
    return out


def probe_pod(namespace: str, account: str, priority_class: str) -> dict[str, Any]:
    """A pod of ``account`` the team namespace's admission lets in (Volcano's, restricted security, a team priority,
    bounded resources), for a server-side dry run: its answer shows what a pod created now would get."""
    bounded = {"cpu": "100m", "memory": "64Mi"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gpuyard-irsa-probe", "namespace": namespace},
            "spec": {"serviceAccountName": account, "priorityClassName": priority_class, "schedulerName": SCHEDULER_NAME,
                     "securityContext": {"runAsNonRoot": True, "runAsUser": 1000,
                                         "seccompProfile": {"type": "RuntimeDefault"}},
                     "containers": [{"name": "probe", "image": "probe", "resources": {"requests": bounded,
                                                                                       "limits": bounded},
                                     "securityContext": {"allowPrivilegeEscalation": False,
                                                         "capabilities": {"drop": ["ALL"]}}}]}}


def injected(pod: dict[str, Any]) -> bool:
    """Whether the (dry-run) ``pod`` came back with the role's variables."""
    return any(env["name"] == "AWS_ROLE_ARN" for env in pod["spec"]["containers"][0].get("env", []))
