"""KubeRay's operator on the real nodes: a pod in the stack's KubeRay namespace, as the chart runs it on EKS.

Upstream's own manifests at the built tag (ray-operator/config/rbac and config/manager/manager.yaml of the Go module,
v1.6.0) with the chart's rules for the Volcano batch scheduler (kuberay helm-chart/kuberay-operator/templates/
_helpers.tpl ``role.consistentRules``: podgroups, and reading CRDs), the stack's flags (infra/operators.py), in the
namespace the team NetworkPolicies admit it from (infra/tenancy.py ``allow-kuberay-operator``). So its requests to
a head's dashboard leave a pod of that namespace, and the team's default-deny decides them as on EKS.

What is stood in: the image, ``/manager`` (the sim's build of ray-operator, linked with cgo as upstream's Dockerfile
builds it) beside the C library it names, from this Debian 12 machine, as upstream's distroless/base-debian12 holds
it, user 65532; the API server, which listens on loopback, is reached through sim/relay.py on the bridge (the pod's
``KUBERNETES_SERVICE_HOST``/``PORT``; its service account token is the real one). Its CPU request is dropped: the real
node has this machine's 2 cores, which the tests' Ray clusters request to the last millicore.
"""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path
from typing import Any

from gpuyard.infra import operators
from gpuyard.infra.tenancy import KUBERAY_NAMESPACE
from gpuyard.sim.registry import Registry
from gpuyard.sim.upstream import documents

REPOSITORY = "gpuyard-sim/kuberay-operator"
USER = "65532"  # distroless's nonroot, as upstream's Dockerfile runs it
NAME = "kuberay-operator"
VOLCANO_RULES = [
    {"apiGroups": ["scheduling.volcano.sh"], "resources": ["podgroups"],
     "verbs": ["create", "delete", "get", "list", "update", "watch"]},
    {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["get"]},
]


def _libraries(binary: Path) -> list[Path]:
    """The shared objects ``ldd`` resolves for ``binary`` (and the loader), as absolute paths."""
    listing = subprocess.run(["ldd", str(binary)], check=True, capture_output=True, text=True).stdout
    paths = []
    for line in listing.splitlines():
        fields = line.split()
        path = fields[2] if "=>" in fields and len(fields) > 2 else fields[0]
        if path.startswith("/"):
            paths.append(Path(path))
    return paths


def image_layer(binary: Path) -> bytes:
    """``/manager``, the libraries it links, and a passwd naming USER."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        files = {"manager": binary.read_bytes(),
                 "etc/passwd": f"root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:{USER}:{USER}::/home/nonroot:"
                               f"/sbin/nologin\n".encode()}
        files |= {str(path).lstrip("/"): path.resolve().read_bytes() for path in _libraries(binary)}
        folders = sorted({str(Path(name).parents[i]) for name in files for i in range(len(Path(name).parts) - 1)})
        for folder in folders:
            member = tarfile.TarInfo(folder)
            member.type, member.mode = tarfile.DIRTYPE, 0o755
            archive.addfile(member)
        for name, data in files.items():
            member = tarfile.TarInfo(name)
            member.size, member.mode = len(data), 0o644 if name.startswith("etc/") else 0o755
            archive.addfile(member, io.BytesIO(data))
    return buffer.getvalue()


def push(registry: Registry, binary: Path) -> str:
    return registry.push(REPOSITORY, image_layer(binary), {"Entrypoint": ["/manager"], "User": f"{USER}:{USER}"})


def manifests(module: Path, image: str, node: str, api_server: tuple[str, int]) -> list[dict[str, Any]]:
    """The service account, its ClusterRole and binding, and the Deployment on ``node`` running ``image``."""
    config = module / "config"
    account = _one(config / "rbac" / "service_account.yaml")
    account["metadata"]["namespace"] = KUBERAY_NAMESPACE
    role = _one(config / "rbac" / "role.yaml")
    role["rules"] = [*role["rules"], *VOLCANO_RULES]
    binding = _one(config / "rbac" / "role_binding.yaml")
    binding["subjects"] = [{**s, "namespace": KUBERAY_NAMESPACE} for s in binding["subjects"]]
    deployment = _one(config / "manager" / "manager.yaml")
    deployment["metadata"]["namespace"] = KUBERAY_NAMESPACE
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    host, port = api_server
    container |= {
        "image": image,
        "args": [*operators.KUBERAY_OPERATOR_ARGS, "--enable-leader-election=false"],
        "env": [{"name": "KUBERNETES_SERVICE_HOST", "value": host},
                {"name": "KUBERNETES_SERVICE_PORT", "value": str(port)}],
        # memory as upstream's; no CPU (a limit alone would default the request to it)
        "resources": {kind: {"memory": container["resources"][kind]["memory"]} for kind in ("requests", "limits")},
    }
    pod |= {"nodeSelector": {"kubernetes.io/hostname": node}, "tolerations": [{"operator": "Exists"}]}
    return [account, role, binding, deployment]


def _one(path: Path) -> dict[str, Any]:
    [document] = list(documents(path))
    return document
