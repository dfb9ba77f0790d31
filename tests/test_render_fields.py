"""One test per JobSpec field or rendering rule that matters on a cluster."""

import shlex
import socket
import subprocess
from pathlib import Path

import pytest
import yaml

from gpuyard.infra.config import ConfigError, Team, parse_stack
from gpuyard.infra.conventions import (
    ANNOTATION_DO_NOT_DISRUPT,
    GPU_TAINT_KEY,
    LABEL_CAPACITY_TYPE,
    LABEL_NODEPOOL,
    LABEL_TEAM,
    METRICS_PORT,
    NODEPOOL_CPU,
    NODEPOOL_GPU_ON_DEMAND,
    NODEPOOL_GPU_SPOT,
)
from gpuyard.infra.images import image_ref
from gpuyard.jobs.render import render, write_manifests
from gpuyard.jobs.local_aws import free_port
from gpuyard.jobs.render.mpi import SSH_PORT, SSHD_WAIT_SECONDS, wait_for_sshd
from gpuyard.jobs.spec import KINDS, MAX_RESTARTS, SpecError, parse_env, parse_nodes, trainer_args
from gpuyard.jobs.workload.args import LAUNCH_MODULE, RAY_MODULE, TORCHRUN_MODULE, TRAIN_MODULE, parse_args
from dockerfile_parse import Dockerfile
from render_helpers import (
    STACK,
    make_spec,
    pod_templates,
    rendered,
    trainer_argv,
    trainer_resources,
    trainer_templates,
)


def trainer_container(manifest: dict) -> dict:
    _, pod = trainer_templates(manifest)[0]
    return pod["spec"]["containers"][0]


def env_of(container: dict) -> dict[str, str]:
    return {item["name"]: item["value"] for item in container.get("env", [])}


# --- the trainer command line is TrainArgs.to_argv(), the one the workload parses ---

def expected_argv(kind: str, team: str = "vision") -> list[str]:
    spec = make_spec(kind, team)
    return trainer_args(f"s3://yard-checkpoints/teams/{team}/{spec.name}").to_argv()


@pytest.mark.parametrize("kind", KINDS)
def test_trainer_gets_train_args_to_argv_verbatim(kind):
    argv = trainer_argv(rendered(kind))
    if kind == "rayjob":  # the Ray entry takes the trainer's arguments plus its worker count, device and restarts
        argv, launcher = argv[:-5], argv[-5:]
        assert launcher == ["--num-workers", "2", "--use-gpu", "--max-restarts", "3"]
    assert argv == expected_argv(kind)
    assert parse_args(argv).to_argv() == argv


@pytest.mark.parametrize("kind", ["pytorchjob", "trainjob"])
def test_torchrun_runs_the_trainer_module_exits_with_its_workers_status_and_never_restarts_them(kind):
    """torchrun's own restarts rerun any failure (exit 1 and 2 too): the operator retries, by exit status."""
    manifest = rendered(kind)
    command = manifest["spec"]["trainer"]["command"] if kind == "trainjob" else trainer_container(manifest)["command"]
    assert command[:3] == ["python3", "-m", TORCHRUN_MODULE] and command[-2:] == ["-m", TRAIN_MODULE]
    assert "--max-restarts=0" in command


@pytest.mark.parametrize("kind", ["mpijob", "volcanojob"])
def test_mpirun_runs_the_trainer_module(kind):
    launcher = next(pod for role, _, pod in pod_templates(rendered(kind)) if role in ("launcher", "mpimaster"))
    command = launcher["spec"]["containers"][0]["command"]
    assert "mpirun" in command and command[-3:] == ["python3", "-m", TRAIN_MODULE]
    mpirun = command[command.index("mpirun"):]
    assert mpirun[mpirun.index("plm_rsh_args") + 1].startswith(f"-p {SSH_PORT} ")  # sshd's port, explicit


def test_ray_entrypoint_runs_the_ray_entry_on_every_gpu():
    entry = shlex.split(rendered("rayjob", nodes=3, gpus_per_node=4)["spec"]["entrypoint"])
    assert entry[:3] == ["python", "-m", RAY_MODULE]
    assert entry[-5:-2] == ["--num-workers", "12", "--use-gpu"]


def test_ray_entry_is_told_the_workers_have_no_gpu_on_cpu_jobs():
    """The driver runs on the CPU-only head, so the device is never left to its detection."""
    entry = shlex.split(rendered("rayjob", nodes=2, gpus_per_node=0)["spec"]["entrypoint"])
    assert entry[-5:-2] == ["--num-workers", "2", "--no-use-gpu"]


# --- names, rendezvous, gang ---

def test_rdzv_id_is_unique_per_job_not_the_default():
    first = trainer_container(rendered(name="job-a"))["command"]
    second = trainer_container(rendered(name="job-b"))["command"]
    ids = [next(arg for arg in command if arg.startswith("--rdzv-id=")) for command in (first, second)]
    assert ids == ["--rdzv-id=team-vision-job-a", "--rdzv-id=team-vision-job-b"]
    assert "--rdzv-backend=c10d" in first


def test_fixed_pytorchjob_is_master_plus_workers():
    manifest = rendered(nodes=4, gpus_per_node=8)
    replicas = {role: count for role, count, _ in pod_templates(manifest)}
    assert replicas == {"master": 1, "worker": 3}
    assert "elasticPolicy" not in manifest["spec"]
    command = trainer_container(manifest)["command"]
    assert "--nnodes=4" in command and "--nproc-per-node=8" in command
    assert manifest["spec"]["nprocPerNode"] == "8"


def test_single_node_pytorchjob_has_no_workers():
    assert [role for role, _, _ in pod_templates(rendered(nodes=1))] == ["master"]


def test_elastic_pytorchjob_runs_workers_with_c10d_policy():
    manifest = rendered(nodes=6, min_nodes=2)
    policy = manifest["spec"]["elasticPolicy"]
    assert policy["rdzvBackend"] == "c10d" and (policy["minReplicas"], policy["maxReplicas"]) == (2, 6)
    assert [(role, count) for role, count, _ in pod_templates(manifest)] == [("worker", 6)]
    assert "--nnodes=2:6" in trainer_container(manifest)["command"]
    assert manifest["spec"]["runPolicy"]["schedulingPolicy"]["minAvailable"] == 2


def test_scheduling_policy_uses_team_queue_and_priority():
    policy = rendered("pytorchjob", "nlp")["spec"]["runPolicy"]["schedulingPolicy"]
    assert policy == {"queue": "nlp", "minAvailable": 2, "priorityClass": "gpuyard-low"}


def test_mpijob_waits_for_workers_and_gangs_the_workers():
    spec = rendered("mpijob", nodes=3, gpus_per_node=8)["spec"]
    assert spec["launcherCreationPolicy"] == "WaitForWorkersReady"
    assert spec["slotsPerWorker"] == 8
    assert spec["runPolicy"]["schedulingPolicy"]["minAvailable"] == 3
    launcher = spec["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    mpirun = launcher["command"][launcher["command"].index("mpirun"):]
    assert mpirun[:3] == ["mpirun", "-np", "24"]
    assert env_of(launcher)["MASTER_ADDR"] == "vision-mpijob-worker-0.vision-mpijob.team-vision.svc"
    exported = [launcher["command"][i + 1] for i, arg in enumerate(launcher["command"]) if arg == "-x"]
    assert {"MASTER_ADDR", "MASTER_PORT", "NCCL_DEBUG", "AWS_ROLE_ARN"} <= set(exported)


def test_volcano_job_gangs_every_pod_with_policies():
    spec = rendered("volcanojob", nodes=2)["spec"]
    assert spec["minAvailable"] == 3 and spec["schedulerName"] == "volcano" and spec["queue"] == "vision"
    assert set(spec["plugins"]) == {"ssh", "svc"}
    master = spec["tasks"][0]
    assert master["name"] == "mpimaster" and master["policies"] == [{"event": "TaskCompleted", "action": "CompleteJob"}]
    command = master["template"]["spec"]["containers"][0]["command"]
    hosts = command[command.index("--host") + 1]
    assert hosts.split(",") == [f"vision-volcanojob-mpiworker-{i}.vision-volcanojob:1" for i in range(2)]


def test_a_failing_volcano_job_restarts_whole_a_bounded_number_of_times():
    """Container restarts never count toward maxRetry: pods never restart in place, a failed pod restarts the job."""
    spec = rendered("volcanojob", nodes=2, max_restarts=4)["spec"]
    assert spec["maxRetry"] == 4
    assert {(p["event"], p["action"]) for p in spec["policies"] if "event" in p} == {
        ("PodFailed", "RestartJob"), ("PodEvicted", "RestartJob")}
    assert {task["template"]["spec"]["restartPolicy"] for task in spec["tasks"]} == {"Never"}
    with pytest.raises(SpecError, match="max_restarts"):
        rendered("volcanojob", max_restarts=MAX_RESTARTS + 1)


def test_the_volcano_launcher_waits_for_every_worker_sshd_within_a_bound():
    spec = rendered("volcanojob", nodes=2)["spec"]
    master, worker = spec["tasks"]
    command = master["template"]["spec"]["containers"][0]["command"]
    assert command[:2] == ["bash", "-c"] and command[3] == "wait-for-sshd"
    assert command[4:9] == ["python3", "-m", LAUNCH_MODULE, "--", "mpirun"]  # no restarts: Volcano restarts the job
    script = command[2]
    assert f"SECONDS + {SSHD_WAIT_SECONDS}" in script and f"/{SSH_PORT})" in script and 'exec "$@"' in script
    assert all(f"vision-volcanojob-mpiworker-{i}.vision-volcanojob" in script for i in range(2))
    assert worker["template"]["spec"]["containers"][0]["args"] == ["worker", "-p", str(SSH_PORT)]


def test_the_sshd_wait_gives_up_naming_the_host(tmp_path):
    """The prefix run for real: no sshd listens, so it fails within its bound, naming the host."""
    prefix = wait_for_sshd(["127.0.0.1"], port=free_port(), seconds=1)
    result = subprocess.run([*prefix, "true"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 1 and "sshd of 127.0.0.1:" in result.stderr and "not reachable after 1s" in result.stderr


def test_the_sshd_wait_runs_the_launcher_once_the_port_answers():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        prefix = wait_for_sshd(["127.0.0.1"], port=server.getsockname()[1], seconds=5)
        result = subprocess.run([*prefix, "echo", "launched"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0 and result.stdout == "launched\n"


def test_rayjob_is_volcano_scheduled_and_cleans_up():
    manifest = rendered("rayjob", nodes=3, ttl_seconds_after_finished=120)
    labels = manifest["metadata"]["labels"]
    assert labels["volcano.sh/queue-name"] == "vision" and labels["ray.io/priority-class-name"] == "gpuyard-normal"
    assert "ray.io/scheduler-name" not in labels  # KubeRay 1.7 never reads it: --batch-scheduler=volcano does
    spec = manifest["spec"]
    # KubeRay's TTL is when the finished job's RayCluster (its GPUs) goes, not the RayJob: at once, whatever --ttl
    assert spec["shutdownAfterJobFinishes"] is True and spec["ttlSecondsAfterFinished"] == 0
    group = spec["rayClusterSpec"]["workerGroupSpecs"][0]
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 3


def test_rayjob_names_the_ray_version_its_image_installs():
    """KubeRay v1.6.0 probes the Ray containers over HTTP only when rayVersion is 2.53.0 or later, otherwise with
    `wget`, which an image without it always fails (ray-operator/controllers/ray/common/pod.go,
    supportsUnifiedHealthCheck): the version must be the image's."""
    ray_version = rendered("rayjob")["spec"]["rayClusterSpec"]["rayVersion"]
    assert ray_version == Dockerfile.of("ray").arg_defaults()["RAY_VERSION"]
    assert tuple(map(int, ray_version.split("."))) >= (2, 53, 0)


def test_a_rayjobs_head_where_the_driver_opens_the_storage_gets_the_contract_and_the_specs_env():
    """Measured on the sim's real nodes: without them the driver's storage check failed, `Unable to locate
    credentials`, and the Ray job with it."""
    manifest = rendered("rayjob", env={"AWS_ENDPOINT_URL": "https://s3.local"})
    head = manifest["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    env = {item["name"]: item["value"] for item in head["env"]}
    assert env["AWS_ENDPOINT_URL"] == "https://s3.local"
    assert env["GPUYARD_CHECKPOINT_URI"] == manifest["metadata"]["annotations"]["gpuyard.io/checkpoint-uri"]


def test_a_rayjobs_submitter_asks_kuberays_default_resources_not_a_whole_helper_cpu():
    """It runs `ray job submit` and follows logs; Volcano reserves its request beside the gang (KubeRay v1.6.0
    controllers/ray/batchscheduler/volcano/volcano_scheduler.go, getSubmitterResource)."""
    pod = rendered("rayjob", gpus_per_node=0)["spec"]["submitterPodTemplate"]["spec"]
    assert pod["containers"][0]["resources"] == {"requests": {"cpu": "500m", "memory": "200Mi"},
                                                 "limits": {"cpu": "1", "memory": "1Gi"}}


def test_trainjob_references_the_runtime_and_sizes_nodes():
    spec = rendered("trainjob", nodes=4, gpus_per_node=2)["spec"]
    assert spec["runtimeRef"]["name"] == "torch-distributed"
    assert spec["runtimeRef"]["kind"] == "TrainingRuntime"  # the team's, in its namespace, queue and priority
    assert (spec["trainer"]["numNodes"], spec["trainer"]["numProcPerNode"]) == (4, 2)


# --- every training pod ---

@pytest.mark.parametrize("kind", KINDS)
def test_gpu_requests_equal_limits(kind):
    resources = trainer_resources(rendered(kind, gpus_per_node=4, efa_devices=2))
    assert resources["requests"] == resources["limits"]
    assert resources["limits"]["nvidia.com/gpu"] == "4" and resources["limits"]["vpc.amazonaws.com/efa"] == "2"


def all_env(manifest: dict) -> dict[str, str]:
    """Env of every container (MPI kinds set it on the launcher, which exports it with -x)."""
    if manifest["kind"] == "TrainJob":
        return env_of(manifest["spec"]["trainer"])
    return {k: v for _, _, pod in pod_templates(manifest) for k, v in env_of(pod["spec"]["containers"][0]).items()}


@pytest.mark.parametrize("kind", KINDS)
def test_efa_sets_the_libfabric_provider(kind):
    assert all_env(rendered(kind, gpus_per_node=8, efa_devices=4))["FI_PROVIDER"] == "efa"


def test_no_efa_no_fi_provider():
    assert "FI_PROVIDER" not in env_of(trainer_container(rendered()))


def test_cpu_jobs_have_no_gpu_toleration_or_nccl():
    manifest = rendered(gpus_per_node=0)
    _, pod = trainer_templates(manifest)[0]
    assert "tolerations" not in pod["spec"]
    assert pod["spec"]["nodeSelector"][LABEL_NODEPOOL] == NODEPOOL_CPU
    assert "nvidia.com/gpu" not in trainer_resources(manifest)["limits"]
    assert "NCCL_DEBUG" not in env_of(trainer_container(manifest))


@pytest.mark.parametrize("kind", KINDS)
def test_gpu_pods_tolerate_the_gpu_taint(kind):
    for _, pod in trainer_templates(rendered(kind, gpus_per_node=1)):
        assert [t["key"] for t in pod["spec"]["tolerations"]] == [GPU_TAINT_KEY]


@pytest.mark.parametrize(("capacity", "pool"), [("on-demand", NODEPOOL_GPU_ON_DEMAND), ("spot", NODEPOOL_GPU_SPOT)])
def test_capacity_type_picks_the_node_pool(capacity, pool):
    _, pod = trainer_templates(rendered(capacity_type=capacity))[0]
    assert pod["spec"]["nodeSelector"] == {LABEL_NODEPOOL: pool, LABEL_CAPACITY_TYPE: capacity}


@pytest.mark.parametrize(("capacity", "grace"), [("on-demand", 300), ("spot", 90)])
@pytest.mark.parametrize("kind", KINDS)
def test_grace_period_follows_the_capacity_type_in_the_pods_and_the_trainer(kind, capacity, grace):
    manifest = rendered(kind, capacity_type=capacity)
    argv = trainer_argv(manifest)
    assert parse_args(argv[:-5] if kind == "rayjob" else argv).grace_period == grace
    assert {pod["spec"]["terminationGracePeriodSeconds"] for _, _, pod in pod_templates(manifest)} == {grace}


def test_explicit_node_pool_wins():
    _, pod = trainer_templates(rendered(node_pool="p5-reserved"))[0]
    assert pod["spec"]["nodeSelector"][LABEL_NODEPOOL] == "p5-reserved"


@pytest.mark.parametrize("kind", KINDS)
def test_every_pod_is_protected_labelled_non_root_with_shm(kind):
    for _, _, pod in pod_templates(rendered(kind)):
        assert pod["metadata"]["annotations"][ANNOTATION_DO_NOT_DISRUPT] == "true"
        assert pod["metadata"]["labels"][LABEL_TEAM] == "vision"
        assert pod["spec"]["serviceAccountName"] == "vision-trainer"
        if kind != "trainjob":  # the runtime's pod template owns it; runtimePatches cannot set it
            assert pod["spec"]["priorityClassName"] == "gpuyard-normal"
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
        shm = pod["spec"]["volumes"][0]
        assert shm["emptyDir"]["medium"] == "Memory"
        assert {"name": shm["name"], "mountPath": "/dev/shm"} in pod["spec"]["containers"][0]["volumeMounts"]


@pytest.mark.parametrize("kind", ["pytorchjob", "mpijob", "rayjob", "volcanojob"])
def test_trainer_exposes_the_metrics_port(kind):
    ports = trainer_container(rendered(kind))["ports"]
    assert {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"} in ports


def test_images_per_kind_and_team_override():
    assert make_spec("mpijob").image == image_ref(STACK, "mpi")
    assert make_spec("rayjob").image == image_ref(STACK, "ray")
    assert make_spec("pytorchjob").image == image_ref(STACK, "ddp")
    assert make_spec("pytorchjob", image="registry/mine:1").image == "registry/mine:1"


def test_team_image_replaces_ddp_only():
    config = parse_stack("t", {"gpuyard:cluster_name": "c", "gpuyard:image_registry": "r.example/c",
                               "gpuyard:teams": [{"name": "a", "image": "a/img:2"}]})
    assert make_spec("pytorchjob", "a", config=config).image == "a/img:2"
    assert make_spec("mpijob", "a", config=config).image == image_ref(config, "mpi") == "r.example/c/mpi:0.1.0"


def test_without_a_registry_no_image_falls_back_to_docker_hub():
    config = parse_stack("t", {"gpuyard:cluster_name": "c", "gpuyard:teams": [{"name": "a"}]})
    with pytest.raises(ConfigError, match="has no image registry: set gpuyard:image_registry") as error:
        make_spec("mpijob", "a", config=config)
    assert "\n" not in str(error.value)
    assert make_spec("mpijob", "a", config=config, image="r.example/mpi:1").image == "r.example/mpi:1"


def test_checkpoint_uri_defaults_to_team_prefix_and_job_name():
    assert make_spec(name="run-7").checkpoint_uri == "s3://yard-checkpoints/teams/vision/run-7"


@pytest.mark.parametrize("kind", KINDS)
def test_checkpoint_uri_is_annotated_and_passed_to_the_trainer(kind):
    manifest = rendered(kind, checkpoint_uri="s3://other/ckpt")
    assert manifest["metadata"]["annotations"]["gpuyard.io/checkpoint-uri"] == "s3://other/ckpt"
    argv = trainer_argv(manifest)
    assert argv[argv.index("--checkpoint-uri") + 1] == "s3://other/ckpt"


def test_env_is_added_and_wins_over_nccl_defaults():
    env = env_of(trainer_container(rendered(env={"NCCL_DEBUG": "INFO", "WANDB_MODE": "off"})))
    assert env["NCCL_DEBUG"] == "INFO" and env["WANDB_MODE"] == "off"


def test_max_restarts_and_ttl_reach_the_run_policy():
    run_policy = rendered(max_restarts=7, ttl_seconds_after_finished=60)["spec"]["runPolicy"]
    assert (run_policy["backoffLimit"], run_policy["ttlSecondsAfterFinished"]) == (7, 60)


def test_cpu_and_memory_are_rendered_as_quantities():
    assert trainer_resources(rendered(cpu=0.5, memory_gib=3))["limits"] == {
        "cpu": "500m", "memory": "3Gi", "nvidia.com/gpu": "1"}


def test_render_refuses_a_spec_of_another_team():
    with pytest.raises(ValueError, match="rendered for team"):
        render(make_spec(team="vision"), STACK.team("nlp"))


# --- bad specs ---

@pytest.mark.parametrize(("fields", "message"), [
    ({"nodes": 0}, "nodes"),
    ({"nodes": 2, "min_nodes": 3}, "elastic min nodes 3 > max nodes 2"),
    ({"name": "Not_DNS"}, "name"),
    ({"name": "7b-run"}, "'7b-run' is not a DNS-1035 label"),
    ({"name": "run-"}, "is not a DNS-1035 label"),
    ({"name": "x" * 56}, "too long for a pytorchjob"),
    ({"gpus_per_node": 0, "efa_devices": 1}, "EFA devices need GPU nodes"),
    ({"env": {"1BAD": "x"}}, "env"),
])
def test_bad_specs_raise_one_line(fields, message):
    with pytest.raises(SpecError, match=message) as error:
        make_spec(**fields)
    assert "\n" not in str(error.value)


def test_trainjob_needs_trainer_v2_in_the_stack():
    config = parse_stack("p", {"gpuyard:cluster_name": "p", "gpuyard:image_registry": "r.example/p",
                               "gpuyard:teams": [{"name": "a"}]})
    with pytest.raises(SpecError, match="does not install Kubeflow Trainer v2"):
        make_spec("trainjob", "a", config=config)
    assert make_spec("pytorchjob", "a", config=config).kind == "pytorchjob"


def test_elastic_only_for_pytorchjob():
    with pytest.raises(SpecError, match="need kind pytorchjob"):
        make_spec("mpijob", nodes=4, min_nodes=2)


def test_unknown_kind():
    with pytest.raises(SpecError, match="unknown kind 'tfjob'"):
        make_spec("tfjob")


@pytest.mark.parametrize(("text", "parsed"), [("4", (4, 4)), ("2:8", (2, 8))])
def test_parse_nodes(text, parsed):
    assert parse_nodes(text) == parsed


@pytest.mark.parametrize("text", ["", "x", "1:2:3", "2.5"])
def test_parse_nodes_lists_accepted_forms(text):
    with pytest.raises(SpecError, match="expected N or MIN:MAX"):
        parse_nodes(text)


def test_parse_env():
    assert parse_env(["A=1", "B=x=y"]) == {"A": "1", "B": "x=y"}
    with pytest.raises(SpecError, match="expected KEY=VALUE"):
        parse_env(["NOVALUE"])


# --- writing ---

def test_write_manifests_adds_files_and_keeps_others(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    written = write_manifests({Path("x.yaml"): {"kind": "X"}, Path("y.yaml"): {"kind": "Y"}}, tmp_path)
    assert written == [tmp_path / "x.yaml", tmp_path / "y.yaml"]
    assert (tmp_path / "x.yaml").read_text() == "kind: X\n" and (tmp_path / "keep.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt", "x.yaml", "y.yaml"]  # no staging folder left


def test_write_manifests_writes_nothing_when_one_fails(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(yaml.representer.RepresenterError, match="cannot represent an object"):
        write_manifests({Path("good.yaml"): {"kind": "X"}, Path("bad.yaml"): {"kind": object()}}, out)
    assert list(tmp_path.iterdir()) == []


# How a job lands on each kind of pool the runtimes cover: the CLI's flags as build_spec fields.
POOL_FIELDS = {"gpu-on-demand": {}, "gpu-spot": {"capacity_type": "spot"}, "gpu-efa": {"efa_devices": 1},
               "cpu": {"gpus_per_node": 0}}


def test_each_pools_runtime_gives_a_hand_written_trainjob_what_gpuyard_render_gives_its_pods():
    """The Kubeflow SDK's path: a TrainJob that patches nothing gets, from the runtime of its pool, the placement,
    grace, do-not-disrupt, /dev/shm and trainer env (contract, NCCL, EFA, shutdown) ``gpuyard render`` gives."""
    from gpuyard.infra.config import load_stack
    from gpuyard.infra.trainer_runtime import NODE, runtime_pools, training_runtime_spec  # the Pulumi side
    from gpuyard.jobs.placement import place
    from gpuyard.jobs.render.trainjob import NODE_JOB
    from gpuyard.jobs.spec import build_spec

    efa = parse_stack("efa", {"gpuyard:cluster_name": "yard", "gpuyard:teams": [{"name": "vision"}],
                              "gpuyard:addons": {"trainer_v2": True}, "gpuyard:karpenter": {"gpu_families": ["p4d"]}})
    dev = load_stack("dev")
    covered = {pool.name for config in (dev, efa) for pool in runtime_pools(config)}
    assert covered == {*POOL_FIELDS, *(g.name for g in dev.cluster.gpu_node_groups)}
    for config, pool in [(config, pool) for config in (dev, efa) for pool in runtime_pools(config)]:
        team = config.teams[0]
        fields = POOL_FIELDS.get(pool.name, {"node_pool": pool.name, "gpus_per_node": 1})
        fields = {**fields, "gpus_per_node": 8, "nodes": 1} if pool.name == "gpu-efa" else fields
        spec = place(config, build_spec(config, team, "trainjob", name="mine", image="img", **fields))
        manifest = render(spec, team)
        assert manifest["spec"]["runtimeRef"]["name"] == pool.runtime, pool
        [(_, patched)] = trainer_templates(manifest)
        runtime = training_runtime_spec(team, pool, "img", config.checkpoint_bucket)
        replicated = runtime["template"]["spec"]["replicatedJobs"][0]
        template = replicated["template"]["spec"]["template"]
        pod, (container,) = template["spec"], template["spec"]["containers"]
        assert replicated["name"] == container["name"] == NODE == NODE_JOB
        family = {"karpenter.k8s.aws/instance-family": spec.instance_family} if spec.instance_family else {}
        assert {**pod["nodeSelector"], **family} == patched["spec"]["nodeSelector"], pool
        assert pod["terminationGracePeriodSeconds"] == patched["spec"]["terminationGracePeriodSeconds"], pool
        assert template["metadata"]["annotations"] == patched["metadata"]["annotations"], pool
        assert container["volumeMounts"] == patched["spec"]["containers"][0]["volumeMounts"]
        assert [v["name"] for v in pod["volumes"]] == [v["name"] for v in patched["spec"]["volumes"]]
        # what the pod's env resolves to for a job named "mine" (its JobSet's label; $(VAR) expanded)
        env = {e["name"]: e.get("value", spec.name).replace("$(GPUYARD_JOB_NAME)", spec.name) for e in container["env"]}
        rendered_env = env_of(manifest["spec"]["trainer"])
        assert env == {name: value for name, value in rendered_env.items() if name in env}, pool
        assert set(rendered_env) - set(env) <= {"OMPI_MCA_odls_base_sigkill_timeout"}, pool
