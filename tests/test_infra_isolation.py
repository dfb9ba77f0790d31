"""Tenant isolation in the planned stacks: Pod Security ``restricted`` namespaces that our own job templates
satisfy, an admission policy (its CEL run by cel-python) refusing host-reaching pods whoever creates them, and
NetworkPolicies, enforced by the vpc-cni add-on, that keep DNS, a job's own traffic, S3 and scraping working."""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass, field

import celpy
import pytest

from conftest import with_registry
from gpuyard.infra.config import ConfigError, load_stack, parse_stack
from gpuyard.infra.tenancy import POD_ADMISSION_POLICY, pod_admission_validations
from gpuyard.infra.plan import plan_values, stack_values
from gpuyard.infra.trainer_runtime import runtime_pools, training_runtime_spec
from infra_plans import of_type, planned
from gpuyard.jobs.render import default_specs, render
from pod_security import pod_specs, restricted_violations

STACKS = ("dev", "prod", "ephemeral")
NAMESPACE = "kubernetes:core/v1:Namespace"
NETWORK_POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"


@pytest.mark.parametrize("stack", STACKS)
def test_team_namespaces_enforce_restricted(stack):
    namespaces = {n.inputs["metadata"]["name"]: n.inputs["metadata"]["labels"] for n in of_type(planned(stack), NAMESPACE)}
    teams = load_stack(stack).teams
    assert set(namespaces) == {team.namespace for team in teams}
    for team in teams:
        labels = namespaces[team.namespace]
        assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
        assert labels["pod-security.kubernetes.io/warn"] == labels["pod-security.kubernetes.io/audit"] == "restricted"
        assert labels["gpuyard.io/team"] == team.name  # what the admission policy binding selects


def test_baseline_needs_a_written_reason():
    with pytest.raises(ConfigError, match="pod_security baseline needs pod_security_reason"):
        parse_stack("t", {"gpuyard:cluster_name": "t", "gpuyard:teams": [{"name": "a", "pod_security": "baseline"}]})
    reason = "profiler image runs as root until rebuilt"
    config = parse_stack("t", {"gpuyard:cluster_name": "t", "gpuyard:teams": [
        {"name": "a", "pod_security": "baseline", "pod_security_reason": reason}]})
    assert config.team("a").pod_security == "baseline"


def rendered_pods(stack: str) -> list[tuple[str, dict]]:
    config = with_registry(load_stack(stack))
    return [(f"{spec.kind}/{spec.team}", pod) for spec in default_specs(config)
            for pod in pod_specs(render(spec, config.team(spec.team)))]


@pytest.mark.parametrize("stack", STACKS)
def test_our_job_templates_meet_restricted(stack):
    pods = rendered_pods(stack)
    kinds = {"pytorchjob", "mpijob", "rayjob", "volcanojob"} | ({"trainjob"} if load_stack(stack).addons.trainer_v2 else set())
    assert {name.split("/")[0] for name, _ in pods} == kinds
    assert [(name, restricted_violations(pod)) for name, pod in pods if restricted_violations(pod)] == []


@pytest.mark.parametrize("stack", STACKS)
def test_each_team_training_runtime_meets_restricted_on_its_own(stack):
    """A TrainJob that patches nothing (written by hand, not by gpuyard render) is admitted in the team namespace."""
    config = load_stack(stack)
    for team in config.teams:
        for pool in runtime_pools(config):
            runtime = training_runtime_spec(team, pool, "reg/ddp:1", config.checkpoint_bucket)
            job = runtime["template"]["spec"]["replicatedJobs"][0]["template"]
            assert restricted_violations(job["spec"]["template"]["spec"]) == [], (team.name, pool.name)

@pytest.mark.parametrize(
    ("pod", "violation"),
    [
        ({"hostNetwork": True}, "hostNetwork=true"),
        ({"volumes": [{"name": "h", "hostPath": {"path": "/"}}]}, "volume h of type hostPath"),
        ({"securityContext": {"runAsNonRoot": False}}, "runAsNonRoot must be true"),
        ({"capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]}}, "adds capabilities"),
    ],
)
def test_the_restricted_check_catches_what_it_must(pod, violation):
    good = rendered_pods("dev")[0][1]
    container = dict(good["containers"][0])
    if "capabilities" in pod:
        container["securityContext"] = {**container["securityContext"], "capabilities": pod.pop("capabilities")}
    bad = {**good, **pod, "containers": [container],
           "securityContext": {**good["securityContext"], **pod.get("securityContext", {})}}
    assert any(violation in v for v in restricted_violations(bad))


# -- the admission policy, evaluated ---------------------------------------------------------------

ENVIRONMENT = celpy.Environment()
PROGRAMS = [(v["message"], ENVIRONMENT.program(ENVIRONMENT.compile(v["expression"])))
            for v in pod_admission_validations()]


def refusals(pod_spec: dict) -> list[str]:
    """The messages of the policy's validations that fail for a pod with this spec."""
    activation = {"object": celpy.json_to_cel({"apiVersion": "v1", "kind": "Pod", "spec": pod_spec})}
    return [message for message, program in PROGRAMS if not program.evaluate(activation)]


BASE_POD = {"containers": [{"name": "c", "image": "i"}]}


@pytest.mark.parametrize(
    ("pod", "message"),
    [
        ({"containers": [{"name": "c", "securityContext": {"privileged": True}}]}, "privileged containers"),
        ({**BASE_POD, "initContainers": [{"name": "i", "securityContext": {"privileged": True}}]}, "privileged containers"),
        ({**BASE_POD, "ephemeralContainers": [{"name": "e", "securityContext": {"privileged": True}}]},
         "privileged containers"),
        ({"containers": [{"name": "c", "securityContext": {"capabilities": {"add": ["NET_ADMIN"]}}}]},
         "may not add Linux capabilities"),
        ({**BASE_POD, "volumes": [{"name": "v", "emptyDir": {}}, {"name": "h", "hostPath": {"path": "/var/run"}}]},
         "hostPath volumes"),
        ({**BASE_POD, "hostNetwork": True}, "hostNetwork is not allowed"),
        ({**BASE_POD, "hostPID": True}, "hostPID is not allowed"),
        ({**BASE_POD, "hostIPC": True}, "hostIPC is not allowed"),
    ],
)
def test_admission_policy_refuses_host_reaching_pods(pod, message):
    assert [m for m in refusals(pod) if message in m] and len(refusals(pod)) == 1


def test_admission_policy_admits_plain_pods_and_every_rendered_template():
    assert refusals(BASE_POD) == []
    assert refusals({**BASE_POD, "hostNetwork": False, "volumes": [{"name": "v", "emptyDir": {}}],
                     "containers": [{"name": "c", "securityContext": {"privileged": False,
                                                                       "capabilities": {"drop": ["ALL"]}}}]}) == []
    for name, pod in rendered_pods("dev"):
        assert refusals(pod) == [], name


@pytest.mark.parametrize("stack", STACKS)
def test_admission_policy_binds_to_team_namespaces_for_every_requester(stack):
    resources = planned(stack)
    (policy,) = [p for p in of_type(resources, "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy")
                 if p.inputs["metadata"]["name"] == POD_ADMISSION_POLICY]
    (binding,) = [b for b in of_type(resources, "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding")
                  if b.inputs["spec"]["policyName"] == POD_ADMISSION_POLICY]
    spec = policy.inputs["spec"]
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["pods", "pods/ephemeralcontainers"] and set(rule["operations"]) == {"CREATE", "UPDATE"}
    assert spec["failurePolicy"] == "Fail"
    assert "matchConditions" not in spec and "excludeResourceRules" not in spec["matchConstraints"]  # no exemptions
    assert binding.inputs["spec"] == {
        "policyName": POD_ADMISSION_POLICY,
        "validationActions": ["Deny"],
        "matchResources": {"namespaceSelector": {"matchExpressions": [{"key": "gpuyard.io/team", "operator": "Exists"}]}},
    }
    assert policy.urn in binding.dependencies


# -- NetworkPolicies, evaluated ------------------------------------------------------------------------

@dataclass(frozen=True)
class Pod:
    namespace: str
    labels: dict = field(default_factory=dict)
    ports: dict = field(default_factory=dict)  # container port name -> number
    ip: str = ""


NAMESPACE_LABELS = {"kube-system": {}, "monitoring": {}, "kuberay-system": {}}


def _selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def _peer_matches(peer: dict, policy_namespace: str, other: Pod | str) -> bool:
    if isinstance(other, str):  # an IP outside the cluster
        block = peer.get("ipBlock")
        return bool(block) and ipaddress.ip_address(other) in ipaddress.ip_network(block["cidr"]) and not any(
            ipaddress.ip_address(other) in ipaddress.ip_network(e) for e in block.get("except", []))
    if "ipBlock" in peer:
        return False
    if "namespaceSelector" in peer:
        namespace_labels = {"kubernetes.io/metadata.name": other.namespace, **NAMESPACE_LABELS.get(other.namespace, {})}
        in_namespace = _selects(peer["namespaceSelector"], namespace_labels)
    else:
        in_namespace = other.namespace == policy_namespace
    return in_namespace and _selects(peer.get("podSelector", {}), other.labels)


def _port_matches(rule: dict, port: int, protocol: str, target: Pod | None) -> bool:
    ports = rule.get("ports")
    if not ports:
        return True
    for entry in ports:
        number = target.ports.get(entry["port"]) if isinstance(entry["port"], str) and target else entry["port"]
        if number == port and entry.get("protocol", "TCP") == protocol:
            return True
    return False


def _allowed(policies: list[tuple[str, dict]], pod: Pod, direction: str, other: Pod | str, port: int, protocol: str,
             target: Pod | None) -> bool:
    """Kubernetes semantics: isolated in a direction once any policy selecting the pod lists it; then allowed
    when any rule of any such policy admits the peer and port."""
    kind, key = ("Ingress", "from") if direction == "ingress" else ("Egress", "to")
    selecting = [spec for namespace, spec in policies
                 if namespace == pod.namespace and _selects(spec["podSelector"], pod.labels) and kind in spec["policyTypes"]]
    if not selecting:
        return True
    return any(_port_matches(rule, port, protocol, target) and
               (not rule.get(key) or any(_peer_matches(peer, pod.namespace, other) for peer in rule[key]))
               for spec in selecting for rule in spec.get(direction, []))


def connects(policies, source: Pod, destination: Pod | str, port: int, protocol: str = "TCP") -> bool:
    target = destination if isinstance(destination, Pod) else None
    egress = _allowed(policies, source, "egress", destination, port, protocol, target)
    ingress = target is None or _allowed(policies, target, "ingress", source, port, protocol, target)
    return egress and ingress


@pytest.fixture(scope="module", params=["dev", "prod"])
def policies(request):
    return [(p.inputs["metadata"]["namespace"], p.inputs["spec"]) for p in of_type(planned(request.param), NETWORK_POLICY)]


RANK0 = Pod("team-vision", {"gpuyard.io/job": "a"}, {"metrics": 9464})
RANK1 = Pod("team-vision", {"gpuyard.io/job": "a"})
RAY_HEAD = Pod("team-vision", {"ray.io/node-type": "head"}, {"dashboard": 8265})
OTHER_TEAM = Pod("team-nlp", {"gpuyard.io/job": "b"}, {"metrics": 9464})
COREDNS = Pod("kube-system", {"k8s-app": "kube-dns"})
PROMETHEUS = Pod("monitoring", {"app.kubernetes.io/name": "prometheus"})
KUBERAY = Pod("kuberay-system", {"app.kubernetes.io/name": "kuberay-operator"})
S3 = "52.218.128.10"  # an S3 address of us-west-2


def test_what_jobs_need_is_open(policies):
    assert connects(policies, RANK1, RANK0, 29500)  # torchrun rendezvous / NCCL inside one job
    assert connects(policies, RANK0, COREDNS, 53, "UDP") and connects(policies, RANK0, COREDNS, 53, "TCP")
    assert connects(policies, RANK0, S3, 443)
    assert connects(policies, PROMETHEUS, RANK0, 9464)
    assert connects(policies, KUBERAY, RAY_HEAD, 8265)


def test_the_rest_is_closed(policies):
    assert not connects(policies, OTHER_TEAM, RANK0, 29500)  # another team
    assert not connects(policies, RANK0, OTHER_TEAM, 9464)
    assert not connects(policies, PROMETHEUS, RANK0, 29500)  # monitoring scrapes the metrics port only
    assert not connects(policies, KUBERAY, RANK0, 8265)  # the operator reaches Ray heads only
    assert not connects(policies, RANK0, S3, 80)
    assert not connects(policies, RANK0, "169.254.169.254", 443)
    assert not connects(policies, RANK0, Pod("kube-system", {"app": "other"}), 53, "UDP")


@pytest.mark.parametrize("stack", STACKS)
def test_vpc_cni_enforces_network_policies(stack):
    (addon,) = [a for a in of_type(planned(stack), "aws:eks/addon:Addon") if a.inputs["addonName"] == "vpc-cni"]
    assert json.loads(addon.inputs["configurationValues"]) == {"enableNetworkPolicy": "true"}


def test_a_baseline_team_gets_a_baseline_namespace():
    values = {**stack_values("dev"), "gpuyard:teams": [
        {"name": "vision"}, {"name": "perf", "pod_security": "baseline", "pod_security_reason": "profiler image runs as root until rebuilt"}]}
    namespaces = {n.inputs["metadata"]["name"]: n.inputs["metadata"]["labels"]
                  for n in of_type(plan_values("dev", values).resources, NAMESPACE)}
    assert namespaces["team-perf"]["pod-security.kubernetes.io/enforce"] == "baseline"
    assert namespaces["team-vision"]["pod-security.kubernetes.io/enforce"] == "restricted"
