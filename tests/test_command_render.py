"""`gpuyard render ... -- COMMAND`: the user's command in every kind, every gpuyard setting kept, bad input refused."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpuyard.infra import conventions as contract
from gpuyard.jobs.render import render, to_yaml
from gpuyard.jobs.spec import KINDS
from render_helpers import STACK, make_spec, pod_templates

GPUYARD = Path(sys.executable).with_name("gpuyard")
COMMANDS = {"script": ["train_ddp.py", "--lr", "0.1"], "module": ["-m", "mypkg.train", "--steps", "5"]}


def gpuyard(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(GPUYARD), "render", *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(autouse=True)
def registries(stacks_with_registry):
    """The stacks as they are once gpuyard:image_registry names their ECR registry."""


def without_program(manifest: dict) -> dict:
    """A manifest with every launch command and argument list blanked: what must not change with the command."""
    text = to_yaml(manifest)
    document = yaml.safe_load(text)
    for _, _, pod in pod_templates(document):
        for container in pod["spec"]["containers"]:
            container.pop("command", None)
            container.pop("args", None)
    document["spec"].pop("entrypoint", None)
    document["spec"].get("trainer", {}).pop("command", None)
    document["spec"].get("trainer", {}).pop("args", None)
    return document


@pytest.mark.parametrize("kind", KINDS)
def test_a_command_changes_only_what_runs_not_gang_queue_pool_grace_or_efa(kind):
    fields = {"nodes": 2, "gpus_per_node": 8, "efa_devices": 4, "capacity_type": "spot", "name": "vision-own"}
    reference = render(make_spec(kind, **fields), STACK.team("vision"))
    own = render(make_spec(kind, command=COMMANDS["script"], **fields), STACK.team("vision"))
    assert own != reference
    assert without_program(own) == without_program(reference)


def launch_words(manifest: dict) -> list[str]:
    """Every word of every launch command, the container's args after its command."""
    if manifest["kind"] == "RayJob":
        return manifest["spec"]["entrypoint"].split()
    if manifest["kind"] == "TrainJob":
        return manifest["spec"]["trainer"]["command"] + manifest["spec"]["trainer"]["args"]
    words = []
    for _, _, pod in pod_templates(manifest):
        for container in pod["spec"]["containers"]:
            words += container.get("command", []) + container.get("args", [])
    return words


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("form", COMMANDS)
def test_the_command_and_its_args_end_the_launch_command_in_order(kind, form):
    words = launch_words(render(make_spec(kind, command=COMMANDS[form]), STACK.team("vision")))
    command = COMMANDS[form]
    assert any(words[index:index + len(command)] == command for index in range(len(words)))
    assert "gpuyard.jobs.workload.train" not in words and "gpuyard.jobs.workload.ray_entry" not in words


@pytest.mark.parametrize("kind", ["mpijob", "volcanojob"])
def test_mpirun_ranks_run_the_command_through_the_rank_variables_shim(kind):
    words = launch_words(render(make_spec(kind, command=COMMANDS["script"]), STACK.team("vision")))
    python = words.index("python3", words.index("mpirun"))
    assert words[python:python + 4] == ["python3", "-m", "gpuyard.jobs.command.mpi_rank", "train_ddp.py"]


def test_rayjob_runs_the_command_entry_with_the_workers_gpus_restarts_and_grace():
    manifest = render(make_spec("rayjob", nodes=3, gpus_per_node=2, capacity_type="spot", command=["t.py"]),
                      STACK.team("vision"))
    assert manifest["spec"]["entrypoint"] == ("python -m gpuyard.jobs.command.ray_entry --num-workers 6 --use-gpu "
                                              "--max-restarts 3 --grace-period 90 -- t.py")


def test_every_kind_with_a_command_passes_the_official_schemas(tmp_path, validate_manifests):
    for kind in KINDS:
        for form, command in COMMANDS.items():
            manifest = render(make_spec(kind, command=command, name=f"vision-{form}"), STACK.team("vision"))
            (tmp_path / f"{kind}-{form}.yaml").write_text(to_yaml(manifest))
    result = subprocess.run([sys.executable, str(validate_manifests), "--strict", str(tmp_path)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def test_the_cli_puts_the_words_after_the_double_dash_in_the_job():
    result = gpuyard("--stack", "dev", "--team", "nlp", "--kind", "pytorchjob", "--name", "nlp-own",
                     "--", "train_ddp.py", "--lr", "0.1", "--", "x")
    assert result.returncode == 0, result.stderr
    master = yaml.safe_load(result.stdout)["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    container = master["containers"][0]
    assert container["command"][-1] == "train_ddp.py" and container["args"] == ["--lr", "0.1", "--", "x"]


@pytest.mark.parametrize(("command", "message"), [
    ([], "nothing after --: give the command every rank runs, SCRIPT.py ARGS... or -m MODULE ARGS..."),
    (["/abs/train.py"], "-- /abs/train.py: the script path must be relative to the image's working folder"),
    (["../train.py"], "-- '../train.py': expected SCRIPT.py ARGS... or -m MODULE ARGS..."),
    (["train"], "-- 'train': expected SCRIPT.py ARGS... or -m MODULE ARGS..."),
    (["-m"], "-- -m: -m takes a module name"),
    (["-m", "my-pkg"], "-- -m 'my-pkg': -m takes a module name"),
])
def test_a_bad_command_is_one_line_exit_2_and_nothing_written(tmp_path, command, message):
    result = gpuyard("--stack", "dev", "--team", "nlp", "--kind", "mpijob", "-d", str(tmp_path / "out"), "--", *command)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert message in result.stderr and not (tmp_path / "out").exists()


@pytest.mark.parametrize(("flags", "message"), [
    (["--all"], "--all renders the reference trainer: drop the command after --"),
    (["--team", "nlp", "--kind", "mpijob", "--epochs", "3"], "--epochs is the reference trainer's"),
])
def test_reference_trainer_options_with_a_command_are_refused(flags, message):
    result = gpuyard("--stack", "dev", *flags, "--", "train.py")
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and message in result.stderr


def rank_env(manifest: dict) -> dict[str, str]:
    """The variables every training process of a manifest gets from it (mpirun's ranks only what it exports)."""
    def env_of(container: dict) -> dict[str, str]:
        return {item["name"]: item["value"] for item in container.get("env", [])}

    if manifest["kind"] == "TrainJob":
        return env_of(manifest["spec"]["trainer"])
    if manifest["kind"] == "RayJob":
        return env_of(manifest["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0])
    if manifest["kind"] in ("MPIJob", "Job"):
        launcher = next(pod for role, _, pod in pod_templates(manifest) if role in ("launcher", "mpimaster"))
        container = launcher["spec"]["containers"][0]
        exported = {word for before, word in zip(container["command"], container["command"][1:]) if before == "-x"}
        return {name: value for name, value in env_of(container).items() if name in exported}
    return env_of(manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("capacity", ["on-demand", "spot"])
def test_every_kind_gives_its_ranks_the_same_contract(kind, capacity):
    """Job, team, the team's checkpoint prefix plus the job, the metrics port, and the time from a rank's SIGTERM to
    its SIGKILL: the pod's grace, a third of it under mpirun (which forwards SIGTERM a third in)."""
    spec = make_spec(kind, name="vision-own", capacity_type=capacity, command=COMMANDS["script"])
    grace = {"on-demand": 300, "spot": 90}[capacity]
    env = rank_env(render(spec, STACK.team("vision")))
    assert {name: env.get(name) for name in contract.CONTRACT_VARIABLES} == {
        contract.ENV_JOB_NAME: "vision-own", contract.ENV_TEAM: "vision",
        contract.ENV_CHECKPOINT_URI: "s3://yard-checkpoints/teams/vision/vision-own",
        contract.ENV_GRACE_PERIOD_SECONDS: str(grace // 3 if kind in ("mpijob", "volcanojob") else grace),
        contract.ENV_METRICS_PORT: "9464", contract.ENV_DATA_URI: "s3://yard-checkpoints/data/vision/",
    }


def test_default_names_and_checkpoint_folders_are_new_for_every_submission():
    jobs = []
    for _ in range(2):
        result = gpuyard("--stack", "dev", "--team", "nlp", "--kind", "pytorchjob", "--", "train_ddp.py")
        assert result.returncode == 0, result.stderr
        jobs.append(yaml.safe_load(result.stdout))
    names = [job["metadata"]["name"] for job in jobs]
    assert names[0] != names[1] and all(re.fullmatch(r"nlp-pytorchjob-[a-z0-9]{5}", name) for name in names)
    folders = [job["metadata"]["annotations"]["gpuyard.io/checkpoint-uri"] for job in jobs]
    assert folders[0] != folders[1] and all(folder.endswith(f"/{name}") for folder, name in zip(folders, names))
    assert [rank_env(job)[contract.ENV_CHECKPOINT_URI] for job in jobs] == folders
