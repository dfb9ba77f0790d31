"""Before a job is applied where Karpenter provisions: can its whole gang ever be placed by the NodePools it selects?

Karpenter knows nothing of gangs (kubernetes-sigs/karpenter#742): for a gang that no NodePool can hold entirely it
still launches nodes for the pods that fit (a CPU node for an MPI launcher or Ray head whose GPU workers fit no
instance type; GPU nodes up to the pool's ``limits`` for a gang beyond them), and they idle until consolidated. So
`gpuyard sim submit` refuses such a job before applying it, naming the pool and what is missing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import yaml

from gpuyard.infra.conventions import LABEL_NODEPOOL
from gpuyard.sim.kube import Kubectl, KubectlError
from gpuyard.sim.karpenter import offered
from gpuyard.sim.nodes import SHAPES, family_of, resources

# kubernetes-sigs/karpenter v1.14.1, kwok/cloudprovider/helpers.go newInstanceType: the kwok provider's overhead.
KWOK_RESERVED = {"cpu": 0.1, "memory": 10 * 2**20}
_SUFFIXES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6, "G": 1e9, "m": 1e-3}


class WontFit(ValueError):
    """A gang no NodePool can ever hold; the message says which pool and why."""


def quantity(value: Any) -> float:
    text = str(value)
    for suffix, factor in _SUFFIXES.items():
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * factor
    return float(text)


def pod_requests(pod_spec: dict[str, Any]) -> dict[str, float]:
    total: dict[str, float] = {}
    for container in pod_spec.get("containers", []):
        for name, value in (container.get("resources", {}).get("requests") or {}).items():
            total[name] = total.get(name, 0.0) + quantity(value)
    return total


def _first(tree: Any, key: str) -> Any:
    if isinstance(tree, dict):
        if key in tree:
            return tree[key]
        tree = list(tree.values())
    if isinstance(tree, list):
        return next((found for item in tree if (found := _first(item, key)) is not None), None)
    return None


def pod_sets(manifest: dict[str, Any]) -> Iterator[tuple[int, dict[str, float], dict[str, str]]]:
    """(count, requests per pod, nodeSelector) of every set of identical pods a job of ours makes: each
    ``{replicas, template}`` of PyTorchJob, MPIJob, RayJob and Volcano Job; a TrainJob's ``numNodes`` of
    ``resourcesPerNode`` (its nodeSelector is in its runtime patches)."""
    if manifest.get("kind") == "TrainJob":
        trainer = manifest["spec"]["trainer"]
        requests = {k: quantity(v) for k, v in trainer.get("resourcesPerNode", {}).get("requests", {}).items()}
        yield trainer.get("numNodes", 1), requests, _first(manifest["spec"], "nodeSelector") or {}
        return
    stack: list[Any] = [manifest.get("spec", {})]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            template = node.get("template")
            if isinstance(template, dict) and "containers" in template.get("spec", {}):
                pod = template["spec"]
                yield node.get("replicas", 1), pod_requests(pod), pod.get("nodeSelector", {})
            else:
                stack.extend(node.values())


def _allocatable(instance_type: str) -> dict[str, float]:
    capacity, _ = resources(SHAPES[instance_type])
    free = {name: quantity(value) for name, value in capacity.items()}
    return {**free, **{name: free[name] - reserved for name, reserved in KWOK_RESERVED.items()}}


def check(manifests: list[dict[str, Any]], nodepools: dict[str, dict[str, Any]]) -> None:
    """Raise WontFit if a job in ``manifests`` has a pod no instance type of its NodePool fits, or a gang whose
    total exceeds its NodePool's ``limits``. Pods that select no NodePool are left to the cluster."""
    for manifest in manifests:
        demand: dict[str, dict[str, float]] = {}
        for count, requests, selector in pod_sets(manifest):
            pool_name = selector.get(LABEL_NODEPOOL)
            if pool_name not in nodepools:
                continue
            types = offered([nodepools[pool_name]])
            if not any(all(_allocatable(t).get(k, 0.0) >= v for k, v in requests.items()) for t in types):
                shown = ", ".join(f"{k}={v / 2**30:g}Gi" if k == "memory" else f"{k}={v:g}"
                                  for k, v in sorted(requests.items()))
                families = ", ".join(sorted({family_of(t) for t in types}))
                raise WontFit(f"{manifest['kind']} {manifest['metadata']['name']}: no instance type of NodePool "
                              f"{pool_name} (families {families}) fits a pod requesting {shown}")
            pool_demand = demand.setdefault(pool_name, {})
            for name, value in requests.items():
                pool_demand[name] = pool_demand.get(name, 0.0) + count * value
        for pool_name, needed in demand.items():
            for name, limit in nodepools[pool_name]["spec"].get("limits", {}).items():
                if needed.get(name, 0.0) > quantity(limit):
                    raise WontFit(f"{manifest['kind']} {manifest['metadata']['name']}: its gang needs "
                                  f"{needed[name]:g} {name} from NodePool {pool_name}, whose limit is {limit}")


def live_nodepools(kubectl: Kubectl) -> dict[str, dict[str, Any]]:
    """The cluster's NodePools by name; none where Karpenter does not run (no NodePool CRD)."""
    try:
        return {pool["metadata"]["name"]: pool for pool in kubectl.items("nodepools.karpenter.sh")}
    except KubectlError:
        return {}


def check_files(kubectl: Kubectl, files: list[Path]) -> None:
    """``check`` the manifests of ``files`` against the cluster's NodePools."""
    pools = live_nodepools(kubectl)
    if pools:
        check([m for path in files for m in yaml.safe_load_all(path.read_text()) if m], pools)
