"""`gpuyard sim up --real-nodes 1` with cluster DNS: pods on the real nodes resolve Services (headless ones too) by
name through the sim's CoreDNS, and a 2-rank PyTorchJob rendered by `gpuyard render` trains end to end on the real
CPU node: Volcano gang-schedules it, the Training Operator starts both pods, the worker finds the master through DNS,
both ranks train over gloo, the checkpoint lands in the team's prefix and the job Succeeded.

The ranks are CPU-only (`--gpus-per-node 0`): both run on the one real node of the CPU NodePool, since the ddp image
unpacks to 5.1 GB per node and this disk holds one copy (README, "Real nodes"); `--cpu 0.9` because that node has the
machine's 2 cores, not an m7i.2xlarge's 8. The stack's S3 bucket is a moto_server on the sim's bridge that this test
starts (the sim has no S3 endpoint of its own yet), reached through the `--env` variables boto3 reads.
Needs what tests/test_sim_real_node.py needs (Go, the images in the registry's storage, the pause package cached).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time

import boto3
import pytest

from infra.config import load_stack
from jobs.local_aws import CREDENTIALS, LocalAWS
from sim import coredns, pause, realnode
from sim.images import build_images
from sim_running import pod_ended, running_sim

pytestmark = [
    pytest.mark.sim,
    pytest.mark.xdist_group("sim"),
    pytest.mark.skipif(shutil.which("go") is None, reason="gpuyard sim builds its components with Go: no `go` on PATH"),
    pytest.mark.timeout(1800),  # the cluster (about 4 min), the image's pull and unpack, the training
]
STACK = "dev"
CPU_NODE = "cpu-m7i-2xlarge-1"  # the dev stack's first on-demand node of the cpu NodePool
TEAM, NAMESPACE = "vision", "team-vision"
JOB = "gang"
JOB_TIMEOUT_SECONDS = 1200
POD_TIMEOUT_SECONDS = 300


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    with running_sim(STACK, tmp_path_factory.mktemp("sim") / "state", real_nodes=1) as cluster:
        yield cluster


def _busybox_pod(name: str, image: str, script: str, labels: dict[str, str] | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default", "labels": labels or {}},
            "spec": {"restartPolicy": "Never", "nodeSelector": {"kubernetes.io/hostname": CPU_NODE},
                     "containers": [{"name": "main", "image": image, "command": ["sh", "-c", script]}]}}


def test_pods_on_a_real_node_resolve_services_and_headless_services_through_the_sims_coredns(sim):
    kubectl = sim.kubectl()
    busybox = pause.push(sim.registry())
    labels = {"app": "dns-target"}
    kubectl.apply([
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "dns-target", "namespace": "default"},
         "spec": {"clusterIP": "None", "selector": labels, "ports": [{"name": "x", "port": 29400}]}},
        _busybox_pod("dns-target", busybox, "sleep 600", labels),
    ])
    deadline = time.monotonic() + POD_TIMEOUT_SECONDS
    while (target := kubectl.get("pod", "dns-target", "default"))["status"].get("phase") != "Running":
        assert time.monotonic() < deadline, json.dumps(target["status"])[-2000:]
        time.sleep(1)
    # as the Training Operator's init container asks (sh, nslookup): the short name through the search path, the
    # full names, and a name no Service has, which must not resolve
    script = ("cat /etc/resolv.conf; nslookup kubernetes.default.svc.cluster.local; "
              "nslookup dns-target.default.svc.cluster.local; nslookup dns-target; "
              "if nslookup missing.default.svc.cluster.local; then exit 3; fi")
    kubectl.apply([_busybox_pod("dns-client", busybox, script)])
    client = pod_ended(kubectl, "dns-client", "default", POD_TIMEOUT_SECONDS)
    logs = kubectl.run("logs", "dns-client", "-n", "default")
    print(logs)
    assert client["status"]["phase"] == "Succeeded", logs + json.dumps(client["status"])[-2000:]
    assert f"nameserver {coredns.ADDRESS}" in logs and "search default.svc.cluster.local svc.cluster.local" in logs
    cluster_ip = kubectl.get("service", "kubernetes", "default")["spec"]["clusterIP"]
    target_ip = kubectl.get("pod", "dns-target", "default")["status"]["podIP"]
    answers = re.findall(r"^Name:\s+(\S+)\nAddress:\s+(\S+)$", logs, re.MULTILINE)  # busybox nslookup's answers
    assert ("kubernetes.default.svc.cluster.local", cluster_ip) in answers
    # the headless Service's name is its pod's address, asked in full and by the short name (through the search path)
    assert answers.count(("dns-target.default.svc.cluster.local", target_ip)) == 2 and target_ip.startswith("10.244.1.")
    assert not [name for name, _ in answers if name.startswith("missing.")]
    kubectl.run("delete", "pod", "dns-target", "dns-client", "-n", "default", "--grace-period=1")


def _job_state(kubectl) -> str:
    conditions = kubectl.get("pytorchjob", JOB, NAMESPACE).get("status", {}).get("conditions", [])
    return next((c["type"] for c in reversed(conditions) if c["status"] == "True"), "")


def test_a_rendered_two_rank_pytorchjob_trains_to_succeeded_on_a_real_node_finding_its_master_through_dns(
        sim, tmp_path):
    kubectl = sim.kubectl()
    registry = sim.registry()
    config = load_stack(STACK)
    build_images(registry, STACK)
    # the pool's kwok nodes are cordoned: the gang can only land where containers really run
    pool = kubectl.run("get", "nodes", "-o", "name", "-l", "karpenter.sh/nodepool=cpu,karpenter.sh/capacity-type=on-demand")
    others = [name for name in pool.split() if name != f"node/{CPU_NODE}"]
    assert others
    kubectl.run("cordon", *others)
    # moto_server on the bridge's own address, which the pods reach (and nothing outside the sim's namespace)
    with LocalAWS(log_path=tmp_path / "moto.log", host=realnode.GATEWAY) as aws:
        s3 = boto3.client("s3", endpoint_url=aws.endpoint_url, region_name=config.region,
                          aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"])
        s3.create_bucket(Bucket=config.checkpoint_bucket,
                         CreateBucketConfiguration={"LocationConstraint": config.region})
        # LOGLEVEL: torchrun's agent then logs each rank's place in the rendezvous (torch/distributed/elastic
        # utils/logging.py reads it; its default is WARNING)
        env = {**aws.env, "AWS_DEFAULT_REGION": config.region, "LOGLEVEL": "INFO"}
        rendered = subprocess.run(
            [sys.executable, "-m", "jobs.cli.main", "render", "--stack", STACK, "--team", TEAM, "--kind", "pytorchjob",
             "--name", JOB, "--gpus-per-node", "0", "--cpu", "0.9", "--epochs", "2",
             "--registry", registry.prefix(config), *(f"--env={k}={v}" for k, v in env.items())],
            capture_output=True, text=True, check=True).stdout
        started = time.monotonic()
        kubectl.run("apply", "-f", "-", stdin=rendered)
        deadline = started + JOB_TIMEOUT_SECONDS
        while (state := _job_state(kubectl)) not in ("Succeeded", "Failed") and time.monotonic() < deadline:
            time.sleep(3)
        print(f"PyTorchJob {state or 'not finished'} {time.monotonic() - started:.0f}s after it was applied")
        pods = {pod["metadata"]["name"]: pod for pod in kubectl.get("pods", namespace=NAMESPACE)["items"]}
        logs = {name: kubectl.run("logs", name, "-n", NAMESPACE, "-c", "pytorch") for name in pods}
        for name, text in logs.items():
            print(f"--- {name}\n{text[-3000:]}")
        assert state == "Succeeded", json.dumps({n: p["status"] for n, p in pods.items()})[-4000:]
        assert sorted(pods) == [f"{JOB}-master-0", f"{JOB}-worker-0"]
        assert {pod["spec"]["nodeName"] for pod in pods.values()} == {CPU_NODE}
        assert all(pod["spec"]["schedulerName"] == "volcano" for pod in pods.values())
        # the worker's init container waited for the master's name (upstream's nslookup loop) and got its address
        master_ip = pods[f"{JOB}-master-0"]["status"]["podIP"]
        init = kubectl.run("logs", f"{JOB}-worker-0", "-n", NAMESPACE, "-c", "init-pytorch")
        assert master_ip in init, init
        done = [json.loads(line) for line in logs[f"{JOB}-master-0"].splitlines() if line.startswith('{"event": "done"')]
        assert len(done) == 1 and done[0]["epochs"] == 2
        prefix = f"{config.team(TEAM).checkpoint_prefix}{JOB}/"
        assert done[0]["checkpoint"].startswith(f"s3://{config.checkpoint_bucket}/{prefix}")
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=config.checkpoint_bucket, Prefix=prefix).get("Contents", [])]
        assert keys, f"no checkpoint under s3://{config.checkpoint_bucket}/{prefix}"
        # both ranks joined one rendezvous of two (torchrun's agent logs each rank's place in the group)
        for name, rank in ((f"{JOB}-master-0", 0), (f"{JOB}-worker-0", 1)):
            status = pods[name]["status"]["containerStatuses"][0]["state"]["terminated"]
            assert status["exitCode"] == 0
            assert f"group_rank={rank}\n" in logs[name] and "group_world_size=2\n" in logs[name], logs[name][-3000:]
