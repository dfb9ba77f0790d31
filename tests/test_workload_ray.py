"""The Ray path with real Ray processes: rank 0's lines as they happen, Ray's job stop given the grace period, and a
worker pod leaving (its preStop hook, then its processes killed) stopping and resuming the trainer.

A cluster of ``ray start --block`` processes stands in for KubeRay's pods (tests/ray_cluster.py); the job is
submitted with the runtime env of the rendered RayJob.
"""

import signal
import threading

import boto3
import pytest
import yaml

from gpuyard.infra.conventions import METRICS_PORT
from gpuyard.jobs.local_aws import free_port
from gpuyard.jobs.render import render
from gpuyard.jobs.workload.args import RAY_STOP_MODULE, TrainArgs
from ray_cluster import RayCluster, cluster_env
from render_helpers import STACK, make_spec
from workload_launch import FaultyProxy, done_event, events, finished, ray_cmd, run, start, trained, wait_for

pytestmark = pytest.mark.slow
ray = pytest.importorskip("ray.train.torch")
LONG = TrainArgs(total_epochs=3000, save_every=1000, batch_size=32, seed=6, lease_seconds=3)


def test_rank_0s_lines_reach_the_driver_as_they_happen(tmp_path):
    """Issue 24: the driver printed rank 0's events only once training had ended (nothing in kubectl logs)."""
    out = tmp_path / "out"
    job = start(ray_cmd(LONG.model_copy(update={"checkpoint_uri": str(tmp_path / "ckpt")})), out)
    try:
        wait_for(lambda: '"event": "epoch"' in out.read_text() or job.poll() is not None, timeout=600,
                 what="the first epoch line")
        assert job.poll() is None, out.read_text()[-3000:]  # the line came while training goes on
        job.send_signal(signal.SIGTERM)
        result = finished(job, out, timeout=300)
    finally:
        if job.poll() is None:
            job.kill()
    assert result.returncode == 143, result.stdout[-3000:]
    stopped = next(e for e in events(result.stdout) if e["event"] == "stopped")
    assert stopped["checkpoint"] and stopped["global_step"] < 3000 * 32


@pytest.fixture
def s3(local_aws):
    boto3.client("s3").create_bucket(Bucket="ckpt")
    return local_aws


@pytest.fixture
def cluster(tmp_path, s3):
    proxy = FaultyProxy(s3.port)
    ray_cluster = RayCluster(cluster_env({**s3.env, "AWS_ENDPOINT_URL": proxy.endpoint_url}), tmp_path)
    try:
        ray_cluster.start_head()
        yield ray_cluster, proxy
    finally:
        ray_cluster.close()
        proxy.close()


def rendered_rayjob(**fields) -> dict:
    """The spot RayJob of a CPU-only 2-node job checkpointing to the test bucket."""
    spec = make_spec("rayjob", nodes=2, gpus_per_node=0, capacity_type="spot", checkpoint_uri="s3://ckpt/run",
                     epochs=3000, **fields)
    return render(spec, STACK.team("vision"))["spec"]


def test_ray_job_stop_waits_for_the_trainer_to_save_within_the_rendered_grace_period(cluster):
    """Ray's job stop SIGKILLs the driver RAY_JOB_STOP_WAIT_TIME_S after its SIGTERM (default 3 s); the stop save
    here takes 5 s (its upload held on the wire), which the rendered runtime env leaves it."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    ray_cluster, proxy = cluster
    ray_cluster.add_node(cpus=2)
    spec = rendered_rayjob()
    entrypoint = spec["entrypoint"].replace(f"--metrics-port {METRICS_PORT}", f"--metrics-port {free_port()}")
    client = JobSubmissionClient(ray_cluster.dashboard_url)
    proxy.delay(b"PUT /ckpt/run/ckpt-")  # the first checkpoint upload: the stop's, as no epoch save comes first
    job = client.submit_job(entrypoint=entrypoint, runtime_env=yaml.safe_load(spec["runtimeEnvYAML"]))
    wait_for(lambda: '"event": "epoch"' in client.get_job_logs(job) or client.get_job_status(job).is_terminal(),
             timeout=600, what="training")
    client.stop_job(job)
    threading.Timer(5.0, proxy.release).start()
    wait_for(lambda: client.get_job_status(job).is_terminal(), timeout=300, what="the job to end")
    logs = client.get_job_logs(job)
    assert client.get_job_status(job) == JobStatus.STOPPED
    stopped = next((e for e in events(logs) if e["event"] == "stopped"), None)
    assert stopped and stopped["checkpoint"] == f"s3://ckpt/run/ckpt-{stopped['global_step']:09d}.json", logs[-3000:]
    assert proxy.delayed.is_set()


def test_a_worker_pod_leaving_stops_the_trainer_at_a_step_it_saves_and_the_job_resumes_there(cluster, tmp_path):
    """The pod's preStop hook (as rendered) asks the trainer to stop and waits; then the node's processes end, a new
    worker node joins, the driver runs the trainer again and it resumes where it stopped, bitwise."""
    ray_cluster, _ = cluster
    node = ray_cluster.add_node(cpus=2)
    args = LONG.model_copy(update={"total_epochs": 400, "save_every": 50, "checkpoint_uri": "s3://ckpt/run"})
    out = tmp_path / "out"
    driver = start(ray_cmd(args) + ["--max-restarts", "1"], out, {**ray_cluster.env, "RAY_ADDRESS": ray_cluster.address})
    try:
        wait_for(lambda: '"event": "epoch"' in out.read_text() or driver.poll() is not None, timeout=600,
                 what="training")
        hook = rendered_rayjob()["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
        command = hook["lifecycle"]["preStop"]["exec"]["command"]
        assert command[:3] == ["python", "-m", RAY_STOP_MODULE]
        prestop = run(command, env={**ray_cluster.env, "RAY_ADDRESS": ray_cluster.address}, timeout=300)
        assert prestop.returncode == 0 and "the trainer has stopped" in prestop.stderr, \
            prestop.stderr[-2000:] + out.read_text()[-3000:]
        assert '"event": "stopped"' in out.read_text()
        ray_cluster.stop_node(node)  # the kubelet's SIGTERM, then SIGKILL
        ray_cluster.add_node(cpus=2)  # the worker group's pod, recreated
        result = finished(driver, out, timeout=900)
    finally:
        if driver.poll() is None:
            driver.kill()
    stopped = next(e for e in events(result.stdout) if e["event"] == "stopped")
    assert stopped["checkpoint"], result.stdout[-3000:]
    assert "running the trainer again (1 of 1 restarts)" in result.stdout
    assert next(e for e in events(result.stdout) if e["event"] == "resume")["global_step"] == stopped["global_step"]
    reference = args.model_copy(update={"checkpoint_uri": None})
    assert trained(done_event(result)) == trained(done_event(run(ray_cmd(reference), timeout=900)))
