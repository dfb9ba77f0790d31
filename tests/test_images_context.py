"""``gpuyard images build --context DIR``: a user's folder on the kind's image, as the CLI runs it (a real process).

The dry runs read the generated Dockerfile, its ignore file and the reference; bad input is one line, exit 2, nothing
written. The slow test builds a folder for real with BuildKit on the dev stack's ddp image (built by
``python -m gpuyard.sim.images dev``) and reads what it pushed from the registry's HTTP API.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from cli_helpers import assert_one_line_error, gpuyard, gpuyard_forked, tree
from dockerfile_parse import Dockerfile
from oci_containers import Image, container
from test_images_build import docker  # noqa: F401 (the fixture)
from gpuyard.infra.config import load_stack, stack_file
from gpuyard.jobs.context_image import HOME, USER
from gpuyard.jobs.spec import KIND_IMAGE, KINDS, default_image

HADOLINT = Path(sys.executable).parent / "hadolint"
TRAIN = "import tabulate\nprint(tabulate.tabulate([[1, 2]]))\n"
REQUIREMENTS = "tabulate==0.9.0\n"  # a pure-Python wheel of 35 kB that no gpuyard image has


@pytest.fixture
def project(tmp_path) -> Path:
    """A user's folder: a script, its requirements, and what must stay out of the image."""
    folder = tmp_path / "project"
    for name, text in {"train.py": TRAIN, "requirements.txt": REQUIREMENTS, "lib/util.py": "X = 1\n",
                       ".git/HEAD": "ref: refs/heads/main\n", "lib/__pycache__/util.cpython-311.pyc": "junk",
                       ".venv/bin/python": "junk"}.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


def dry_run(project: Path, *args: str) -> list[str]:
    result = gpuyard_forked("images", "build", "--context", str(project), "--dry-run", *args)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def section(lines: list[str], title: str) -> list[str]:
    start = lines.index(f"# {title}") + 1
    return lines[start:next(i for i in range(start, len(lines)) if lines[i].startswith("# "))]


@pytest.mark.parametrize("kind", KINDS)
def test_the_dockerfile_layers_the_folder_on_the_image_render_gives_the_kind(project, kind, stacks_with_registry):
    lines = dry_run(project, "--team", "vision", "--kind", kind)
    image = KIND_IMAGE[kind]
    config = load_stack("dev")
    assert section(lines, "Dockerfile") == [
        f"FROM {default_image(config, config.team('vision'), kind)}",
        f'LABEL org.opencontainers.image.base.name="{default_image(config, config.team("vision"), kind)}"',
        f"USER {USER[image]}", f"WORKDIR {HOME[image]}",
        f"COPY --chown={USER[image]} requirements.txt requirements.txt",
        "RUN PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-cache-dir --user -r requirements.txt",
        f"COPY --chown={USER[image]} . .",
    ]
    assert lines[-1].startswith(f"{config.image_registry}/{image}:vision-")
    dockerfile = project.parent / "Dockerfile"
    dockerfile.write_text("\n".join(section(lines, "Dockerfile")) + "\n")
    hadolint = subprocess.run([str(HADOLINT), "--no-color", str(dockerfile)], capture_output=True, text=True,
                              timeout=60)
    assert hadolint.returncode == 0, hadolint.stdout + hadolint.stderr


@pytest.mark.parametrize("image", sorted(HOME))
def test_the_folder_goes_to_the_image_s_working_folder_owned_by_its_user(image):
    dockerfile = Dockerfile.of(image)
    assert HOME[image] == dockerfile.all("WORKDIR")[-1]
    assert USER[image] == dockerfile.expand(dockerfile.all("USER")[-1])


def test_a_team_s_own_image_is_the_base_of_its_ddp_kinds(project, tmp_path, monkeypatch):
    document = yaml.safe_load(stack_file("dev").read_text())
    teams = document["config"]["gpuyard:teams"]
    next(team for team in teams if team["name"] == "vision")["image"] = "registry.example/vision/trainer:3"
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    (stacks / "Pulumi.dev.yaml").write_text(yaml.safe_dump(document))
    monkeypatch.setenv("GPUYARD_STACKS_DIR", str(stacks))
    assert section(dry_run(project, "--team", "vision", "--kind", "trainjob"), "Dockerfile")[0] == \
        "FROM registry.example/vision/trainer:3"
    assert section(dry_run(project, "--team", "vision", "--kind", "mpijob"), "Dockerfile")[0] == \
        "FROM gpuyard-dev/mpi:0.1.0"


def test_without_requirements_nothing_is_installed(project):
    (project / "requirements.txt").unlink()
    dockerfile = section(dry_run(project, "--team", "nlp", "--kind", "rayjob"), "Dockerfile")
    assert not [line for line in dockerfile if line.startswith("RUN")] and dockerfile[-1] == "COPY --chown=1000:100 . ."


def test_git_caches_and_venvs_stay_out_and_the_user_s_own_ignores_are_kept(project):
    (project / ".dockerignore").write_text("data/")
    assert section(dry_run(project, "--team", "nlp", "--kind", "mpijob"), "Dockerfile.dockerignore") == [
        "data/", "**/.git", "**/__pycache__", "**/.venv"]


def test_the_tag_follows_the_folder_s_content_and_the_base(project):
    job = ("--team", "vision", "--kind", "pytorchjob")
    first = dry_run(project, *job)[-1]
    assert dry_run(project, *job)[-1] == first
    for ignored in (".git/HEAD", "lib/__pycache__/util.cpython-311.pyc", ".venv/bin/python"):
        (project / ignored).write_text("changed")
    assert dry_run(project, *job)[-1] == first
    assert dry_run(project, "--team", "vision", "--kind", "mpijob")[-1].split(":")[-1] != first.split(":")[-1]
    (project / "lib" / "util.py").write_text("X = 2\n")
    changed = dry_run(project, *job)[-1]
    assert changed != first and changed.startswith("gpuyard-dev/ddp:vision-")
    assert dry_run(project, *job, "--tag", "v1.2_rc-3")[-1] == "gpuyard-dev/ddp:v1.2_rc-3"
    (project / "data").symlink_to("/nowhere")
    os.mkfifo(project / "fifo")  # no content: left out of the digest (reading it would wait forever)
    linked = dry_run(project, *job)[-1]
    (project / "data").unlink()
    (project / "data").symlink_to("/elsewhere")
    relinked = dry_run(project, *job)[-1]
    assert relinked not in (linked, changed)
    (project / "train.py").chmod(0o755)
    assert dry_run(project, *job)[-1] != relinked


def test_the_build_command_pushes_the_reference_to_the_registry_given(project):
    lines = dry_run(project, "--team", "nlp", "--kind", "rayjob", "--registry", "127.0.0.1:5000/gpuyard-dev",
                    "--push")
    command = shlex.split(section(lines + ["# end"], "build")[0])
    assert Path(command[0]).name == "buildctl" and f"context={project}" in command
    assert command[command.index("--output") + 1] == (f"type=image,name={lines[-1]},push=true,"
                                                      "registry.insecure=true,compression=uncompressed")
    assert lines[-1].startswith("127.0.0.1:5000/gpuyard-dev/ray:nlp-")
    assert section(lines, "Dockerfile")[0] == "FROM 127.0.0.1:5000/gpuyard-dev/ray:0.1.0"


def test_with_a_docker_engine_buildx_builds_the_folder_with_the_dockerfile_outside_it(project, docker):
    """docker is test_images_build's recording stand-in; the Dockerfile it is given is gone after the build."""
    env, calls = docker
    result = gpuyard("images", "build", "--context", str(project), "--team", "nlp", "--kind", "volcanojob", env=env)
    assert result.returncode == 0, result.stderr
    [build] = [call["args"] for call in calls() if call["args"][:2] == ["buildx", "build"]]
    dockerfile = Path(build[build.index("--file") + 1])
    assert build[-1] == str(project) and project not in dockerfile.parents and not dockerfile.parent.exists()
    assert build[build.index("--tag") + 1] == result.stdout.splitlines()[-1]
    assert result.stdout.splitlines()[-1].startswith("gpuyard-dev/mpi:nlp-") and "--load" in build


def test_the_sim_s_registry_on_its_bridge_speaks_plain_http_too(project, tmp_path):
    """With real nodes the sim's registry listens on its bridge address (sim/realnode.py), not on loopback."""
    state = tmp_path / "cache" / "sim" / "state" / "dev"
    state.mkdir(parents=True)
    (state / "registry.json").write_text(json.dumps({"address": "10.244.0.1:5000"}))
    lines = []
    for cache in (tmp_path / "cache", tmp_path / "no-sim"):
        result = gpuyard_forked("images", "build", "--context", str(project), "--team", "nlp", "--kind", "mpijob",
                                "--registry", "10.244.0.1:5000/gpuyard-dev", "--push", "--dry-run",
                                env={"GPUYARD_CACHE": str(cache)})
        assert result.returncode == 0, result.stderr
        lines.append(result.stdout.splitlines())
    commands = [shlex.split(section(run + ["# end"], "build")[0]) for run in lines]
    outputs = [command[command.index("--output") + 1].split(",")[2:] for command in commands]
    assert outputs == [["push=true", "registry.insecure=true", "compression=uncompressed"], ["push=true"]]


@pytest.mark.parametrize("args, names", [
    (["--context", "nope", "--team", "nlp", "--kind", "mpijob"], "--context nope: no such folder"),
    (["--context", "file.txt", "--team", "nlp", "--kind", "mpijob"], "--context file.txt: is not a folder"),
    (["--context", "", "--team", "nlp", "--kind", "mpijob"], "--context is empty"),
    (["--context", "project", "--team", "ghost", "--kind", "mpijob"], "--team: unknown team 'ghost'"),
    (["--context", "project", "--kind", "mpijob"], "--context needs --team"),
    (["--context", "project", "--team", "nlp"], "--context needs --kind"),
    (["--context", "project", "--team", "nlp", "--kind", "cronjob"], "Invalid value for '--kind': 'cronjob'"),
    (["--context", "project", "--team", "nlp", "--kind", "trainjob", "--stack", "prod"],
     "--kind trainjob: stack 'prod' does not install Kubeflow Trainer v2"),
    *[(["--context", "project", "--team", "nlp", "--kind", "mpijob", "--tag", tag], f"--tag {tag!r}: not an image tag")
      for tag in ["", "-x", ".x", "a:b", "a/b", "a b", "t" * 129, "ünï"]],
    (["--context", "project", "--team", "nlp", "--kind", "mpijob", "--registry", "HTTP://x"], "--registry 'HTTP://x'"),
    (["--context", "project", "--team", "nlp", "--kind", "mpijob", "--push"], "gpuyard:image_registry"),
    (["--context", "project", "--team", "nlp", "--kind", "mpijob", "-i", "ddp"], "--image is not for --context"),
    (["--context", "project", "--team", "nlp", "--kind", "mpijob", "--build-arg", "A=1"],
     "--build-arg is not for --context"),
    (["--team", "nlp"], "--team needs --context DIR"),
    (["--kind", "mpijob"], "--kind needs --context DIR"),
    (["--tag", "v1"], "--tag needs --context DIR"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_bad_input_is_one_line_exit_2_and_nothing_written(project, args, names):
    folder = project.parent
    (folder / "file.txt").write_text("not a folder\n")
    before = tree(folder)
    result = gpuyard_forked("images", "build", "--dry-run", *args, cwd=folder,
                            env={"GPUYARD_CACHE": str(folder / "cache")})
    assert_one_line_error(result, names)
    assert result.stdout == "" and tree(folder) == before and result.session_left == []


def blob(address: str, repository: str, digest: str) -> bytes:
    with urllib.request.urlopen(f"http://{address}/v2/{repository}/blobs/{digest}", timeout=60) as response:
        return response.read()


def layer_files(address: str, repository: str, digest: str) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(blob(address, repository, digest)), mode="r:*") as layer:
        return {member.name: member for member in layer.getmembers()}


@pytest.mark.slow
def test_buildkit_builds_the_folder_on_the_ddp_image_and_pushes_it_to_the_registry(project, tmp_path):
    """BuildKit for real (no Docker engine here) on the dev stack's ddp image, pushing to a registry on loopback."""
    from gpuyard.sim.build import build_component
    from gpuyard.sim.paths import cache_root
    from gpuyard.sim.registry import serving
    from gpuyard.sim.versions import IMAGE_COMPONENTS

    config = load_stack("dev")
    binary = build_component(next(c for c in IMAGE_COMPONENTS if c.name == "registry"), print) / "registry"
    with serving(tmp_path / "registry", binary) as registry:  # the cache's storage, where the images are
        prefix = registry.prefix(config)
        base = f"{prefix}/ddp:{config.image_tag}"
        assert registry.manifest("gpuyard-dev/ddp", config.image_tag), f"no {base}: python -m gpuyard.sim.images dev"
        started = time.monotonic()
        result = gpuyard("images", "build", "--context", str(project), "--team", "vision", "--kind", "pytorchjob",
                         "--registry", prefix, "--push", timeout=600)
        print(f"built and pushed in {time.monotonic() - started:.0f}s")
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        ref = result.stdout.splitlines()[-1]
        repository, tag = ref.removeprefix(f"{registry.address}/").rsplit(":", 1)
        assert repository == "gpuyard-dev/ddp" and tag.startswith("vision-")
        _, body = registry.manifest(repository, tag)
        manifest = json.loads(body)
        base_layers = json.loads(registry.manifest(repository, config.image_tag)[1])["layers"]
        try:
            assert manifest["layers"][:len(base_layers)] == base_layers  # layered on the kind's image
            image = json.loads(blob(registry.address, repository, manifest["config"]["digest"]))["config"]
            assert (image["User"], image["WorkingDir"]) == ("1000:1000", "/home/gpuyard")
            assert image["Labels"]["org.opencontainers.image.base.name"] == base
            files = {}
            for layer in manifest["layers"][len(base_layers):]:
                files.update(layer_files(registry.address, repository, layer["digest"]))
            script = files["home/gpuyard/train.py"]
            assert (script.uid, script.gid, script.size) == (1000, 1000, len(TRAIN))
            assert "home/gpuyard/lib/util.py" in files and "home/gpuyard/requirements.txt" in files
            installed = files["home/gpuyard/.local/lib/python3.11/site-packages/tabulate/__init__.py"]
            assert installed.uid == 1000
            copied = [name for name in files if not name.startswith("home/gpuyard/.local/")]
            assert not [name for name in copied if {".git", "__pycache__", ".venv"} & set(name.split("/"))], copied
            output = tmp_path / "train.log"  # the script runs as the image's user, importing what pip installed
            with container(Image.pull(ref), "context-train", tmp_path / "bundle", output,
                           args=["python3", "train.py"]) as run:
                assert run.wait(timeout=120) == 0, output.read_text()
            assert "1  2" in output.read_text().splitlines()
        finally:  # the registry's storage is the cache's: leave no test image in it, nor its layers unpacked
            for layer in manifest["layers"][len(base_layers):]:
                shutil.rmtree(cache_root() / "layers" / layer["digest"].replace(":", "-"), ignore_errors=True)
            request = urllib.request.Request(f"http://{registry.address}/v2/{repository}/manifests/"
                                             f"sha256:{hashlib.sha256(body).hexdigest()}", method="DELETE")
            urllib.request.urlopen(request, timeout=30).close()

