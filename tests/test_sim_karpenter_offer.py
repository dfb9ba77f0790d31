"""What the simulated Karpenter is offered and given, from the dev stack's offline plan (no cluster needed): the
instance types its NodePools allow with their shapes, labels and prices, the NodePools as applied, and the
pre-flight that refuses gangs no NodePool can ever hold."""

from __future__ import annotations

import pytest

from conftest import with_registry
from gpuyard.infra.config import load_stack
from gpuyard.infra.plan import plan
from gpuyard.jobs.render import render_specs
from gpuyard.jobs.spec import build_spec, stack_kinds
from gpuyard.sim import karpenter, nodes, preflight

STACK = "dev"
CONFIG = with_registry(load_stack(STACK))
ZONES = ["us-west-2a", "us-west-2b"]


@pytest.fixture(scope="module")
def pools():
    return karpenter.nodepools(plan(STACK).resources)


def _labels(offering: dict) -> dict[str, str]:
    return {r["key"]: r["values"][0] for r in offering["Requirements"]}


def test_offered_exactly_the_sizes_of_the_nodepool_families(pools):
    listed = {t["name"]: t for t in karpenter.instance_types(pools, CONFIG.region, ZONES)}
    families = set(CONFIG.karpenter.gpu_families) | set(CONFIG.karpenter.cpu_families)
    assert {name.split(".")[0] for name in listed} == families
    assert set(listed) == {name for name in nodes.SHAPES if name.split(".")[0] in families}
    g5 = listed["g5.12xlarge"]
    assert g5["resources"] == {"cpu": "48", "memory": "192Gi", "pods": "250", "ephemeral-storage": "100Gi",
                               "nvidia.com/gpu": "4", "vpc.amazonaws.com/efa": "1"}
    assert listed["c7i.large"]["resources"]["cpu"] == "2" and "nvidia.com/gpu" not in listed["c7i.large"]["resources"]


def test_offerings_per_zone_and_capacity_type_with_aws_labels_and_prices(pools):
    listed = {t["name"]: t for t in karpenter.instance_types(pools, CONFIG.region, ZONES)}
    offerings = listed["g6.xlarge"]["offerings"]
    seen = {(_labels(o)["karpenter.sh/capacity-type"], _labels(o)["topology.kubernetes.io/zone"]) for o in offerings}
    assert seen == {(c, z) for c in ("on-demand", "spot") for z in ZONES}
    assert {o["Price"] for o in offerings} == {0.8048}
    labels = _labels(offerings[0])
    assert labels["karpenter.k8s.aws/instance-family"] == "g6"
    assert labels["karpenter.k8s.aws/instance-size"] == "xlarge"
    assert labels["karpenter.k8s.aws/instance-category"] == "g"
    assert labels["karpenter.k8s.aws/instance-generation"] == "6"
    assert labels["karpenter.k8s.aws/instance-gpu-name"] == "l4"
    assert labels["karpenter.k8s.aws/instance-gpu-manufacturer"] == "nvidia"
    assert labels["karpenter.k8s.aws/instance-gpu-count"] == "1"
    assert labels["karpenter.k8s.aws/instance-memory"] == "16384"
    assert labels["topology.kubernetes.io/region"] == CONFIG.region
    assert all(o["Price"] > 0 for t in listed.values() for o in t["offerings"])


def test_a_family_without_shapes_is_refused(pools):
    pool = pools[0]
    requirements = [dict(r, values=["p5e"]) if r["key"] == karpenter.FAMILY_LABEL else r
                    for r in pool["spec"]["template"]["spec"]["requirements"]]
    bad = {**pool, "spec": {**pool["spec"], "template": {**pool["spec"]["template"], "spec": {
        **pool["spec"]["template"]["spec"], "requirements": requirements}}}}
    with pytest.raises(ValueError, match="'p5e'"):
        karpenter.offered([bad])


def test_nodepools_applied_unchanged_but_the_node_class(pools):
    for pool in pools:
        simulated = karpenter.simulated_nodepool(pool)
        assert simulated["spec"]["template"]["spec"]["nodeClassRef"] == {
            "group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": "gpuyard-sim"}
        assert pool["spec"]["template"]["spec"]["nodeClassRef"]["kind"] == "EC2NodeClass"
        strip = lambda p: {**p["spec"], "template": {**p["spec"]["template"], "spec": {
            k: v for k, v in p["spec"]["template"]["spec"].items() if k != "nodeClassRef"}}}
        assert strip(simulated) == strip(pool) and simulated["metadata"] == pool["metadata"]
        quick = karpenter.simulated_nodepool(pool, "5s")
        assert quick["spec"]["disruption"] == {**pool["spec"]["disruption"], "consolidateAfter": "5s"}


def test_karpenter_mode_has_no_static_nodepool_nodes():
    resources = plan(STACK).resources
    static = {pool.name: pool.count for pool in nodes.pools(resources, karpenter=True)}
    assert static == {"system": 2, "gpu-small": 0}  # managed groups at their desired size
    assert all(pool.count for pool in nodes.pools(resources) if pool.name.startswith("gpu-"))


def _manifests(kind: str, **overrides) -> list[dict]:
    spec = build_spec(CONFIG, CONFIG.team("vision"), kind, **overrides)
    return list(render_specs(CONFIG, [spec]).values())


@pytest.mark.parametrize("kind", stack_kinds(CONFIG))
def test_preflight(pools, kind):
    live = {p["metadata"]["name"]: karpenter.simulated_nodepool(p) for p in pools}
    preflight.check(_manifests(kind), live)
    with pytest.raises(preflight.WontFit, match=r"no instance type of NodePool gpu-on-demand \(families g5, g6\) "
                                                r"fits a pod requesting cpu=48, memory=192Gi, nvidia.com/gpu=16"):
        preflight.check(_manifests(kind, gpus_per_node=16), live)
    with pytest.raises(preflight.WontFit, match="needs 12 nvidia.com/gpu from NodePool gpu-on-demand, whose limit is 8"):
        preflight.check(_manifests(kind, nodes=3, gpus_per_node=4), live)
