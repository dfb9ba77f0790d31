"""`gpuyard sim up --real-nodes 1`: one of the dev stack's GPU nodes is a real kubelet with containerd and runc, and a
pod of the ddp image, pulled from the sim's registry, runs the reference trainer there to completion.

Builds the node's components once (cached, needs Go) and expects the images in the registry's storage (`python -m
gpuyard.sim.images`) and the pause image's package in the cache (`python -m gpuyard.sim.build dev realnode`), as CI prepares them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request

import pytest

from gpuyard.infra.config import load_stack
from gpuyard.sim import nodes, realnode, s3
from gpuyard.sim.images import build_images
from sim_running import pod_ended, running_sim

pytestmark = [
    pytest.mark.sim,
    pytest.mark.xdist_group("sim-without-mpi-operator"),  # beside the "sim" group: no MPI Operator (sim_running.py)
    pytest.mark.skipif(shutil.which("go") is None, reason="gpuyard sim builds its components with Go: no `go` on PATH"),
]
STACK = "dev"
NODE = "gpu-small-g5-xlarge-0"  # the dev stack's first GPU node (its gpu-small managed group)
POD_TIMEOUT_SECONDS = 900
# torchrun with one process, the trainer's gloo on the pod's loopback: one pod is the whole job
TRAINER_ENV = {"PET_NPROC_PER_NODE": "1", "PET_NNODES": "1", "PET_STANDALONE": "1", "GLOO_SOCKET_IFNAME": "lo",
               "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    with running_sim(STACK, tmp_path_factory.mktemp("sim") / "state", real_nodes=1, mpi_operator=False) as cluster:
        yield cluster


def test_the_real_node_is_a_kubelet_with_containerd_shaped_like_its_pool(sim):
    node = sim.kubectl().get("node", NODE)
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == "v1.35.4" and info["containerRuntimeVersion"].startswith("containerd://")
    assert "kwok.x-k8s.io/node" not in node["metadata"].get("annotations", {})
    labels = node["metadata"]["labels"]
    assert labels["eks.amazonaws.com/nodegroup"] == "gpu-small" and labels["gpuyard.io/gpu-node"] == "true"
    assert labels["node.kubernetes.io/instance-type"] == "g5.xlarge"
    assert {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"} in node["spec"]["taints"]
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "1"
    # g5.xlarge's 16 GiB less the EKS reservation (sim/nodes.py), as the kwok nodes of its pool have it
    assert node["status"]["allocatable"]["memory"] == nodes.resources(nodes.SHAPES["g5.xlarge"])[1]["memory"]
    assert [a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP"] == ["10.244.255.1"]


def test_a_second_cluster_with_real_nodes_is_refused_before_anything_is_made(sim, tmp_path):
    """Both would put the pod network's gateway and the cluster DNS address on a bridge of their own."""
    from gpuyard.sim.cluster import Sim

    other = tmp_path / "other"
    with pytest.raises(RuntimeError, match=f"its bridge {realnode.bridge_name(sim.state)} holds {realnode.GATEWAY}"):
        Sim(STACK, other, real_nodes=1).up(print)
    assert not other.exists()


def test_status_names_the_sims_s3_endpoint_on_the_bridge_holding_the_stacks_bucket(sim):
    """`gpuyard sim status --json`'s ``s3_endpoint``: where pods reach the stack's bucket (sim/s3.py)."""
    assert sim.status()["s3_endpoint"] == f"http://{realnode.GATEWAY}:443"
    buckets = s3.endpoint_of(sim.state).client("s3").list_buckets()["Buckets"]
    assert [bucket["Name"] for bucket in buckets] == [load_stack(STACK).checkpoint_bucket]


def _image_command(address: str, repository: str, tag: str) -> list[str]:
    """ENTRYPOINT + CMD from the image's config in the registry."""
    def get(path: str, accept: str) -> dict:
        request = urllib.request.Request(f"http://{address}/v2/{repository}/{path}", headers={"Accept": accept})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.load(response)

    manifest = get(f"manifests/{tag}", "application/vnd.oci.image.manifest.v1+json")
    config = get(f"blobs/{manifest['config']['digest']}", "*/*")["config"]
    return config["Entrypoint"] + config["Cmd"]


def _done(text: str) -> dict:
    events = [json.loads(line[line.index('{"event"'):]) for line in text.splitlines() if '{"event"' in line]
    found = [event for event in events if event["event"] == "done"]
    assert len(found) == 1, text[-4000:]
    return found[0]


def test_a_ddp_pod_from_the_sims_registry_trains_to_completion_on_the_real_node(sim, tmp_path):
    registry = sim.registry()
    reference = build_images(registry, STACK)["ddp"]
    repository, tag = reference.removeprefix(f"{registry.address}/").rsplit(":", 1)
    kubectl = sim.kubectl()
    kubectl.apply([{
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "ddp", "namespace": "default"},
        "spec": {
            "restartPolicy": "Never", "nodeSelector": {"kubernetes.io/hostname": NODE},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "trainer", "image": reference,
                            "env": [{"name": k, "value": v} for k, v in TRAINER_ENV.items()],
                            "resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "1", "memory": "4Gi"}}}],
        },
    }])
    pod = pod_ended(kubectl, "ddp", "default", POD_TIMEOUT_SECONDS)
    terminated = (pod["status"].get("containerStatuses") or [{}])[0].get("state", {}).get("terminated", {})
    logs = kubectl.run("logs", "ddp", "-n", "default") if terminated else ""
    print(logs[-3000:])
    # why first (the pod's reason, an eviction's message, the container's), then the log's end
    assert pod["status"]["phase"] == "Succeeded" and terminated.get("exitCode") == 0, (
        pod["status"].get("reason"), pod["status"].get("message"), terminated, logs[-2000:],
        json.dumps(pod["status"])[-2000:])
    assert pod["spec"]["nodeName"] == NODE and pod["status"]["podIP"].startswith("10.244.0.")
    done = _done(logs)
    # the same command on this machine's torch, outside any container, trains to the same weights
    command = _image_command(registry.address, repository, tag)
    local = subprocess.run([sys.executable, *command[1:]], env={**os.environ, **TRAINER_ENV}, cwd=tmp_path,
                           capture_output=True, text=True, timeout=600)
    assert local.returncode == 0, local.stderr[-3000:]
    assert done["weights_sha256"] == _done(local.stdout + local.stderr)["weights_sha256"]
    assert done["epochs"] == 2
