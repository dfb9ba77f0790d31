"""images/common/install-gpuyard.sh, as the Dockerfiles run it, on a copy of the build context.

The "base image" is a fresh venv that sees this environment's packages (torch, the pinned
requirements) through a .pth file, the way the PyTorch base ships torch; the package lands
in the venv itself, without Pulumi or moto.
"""

from __future__ import annotations

import importlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from dockerfile_parse import IMAGES, REPO, Dockerfile

pytestmark = pytest.mark.slow

INSTALL = IMAGES / "common" / "install-gpuyard.sh"


def build_context(tmp_path: Path) -> Path:
    """What .dockerignore lets into the build (tests/test_images_dockerfiles.py pins that list)."""
    context = tmp_path / "context"
    context.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO / name, context / name)
    for name in ("infra", "jobs", "images"):
        shutil.copytree(REPO / name, context / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return context


@pytest.fixture
def base_python(tmp_path) -> Path:
    venv = tmp_path / "base"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "base-image.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv / "bin" / "python"


def install_modules(image: str) -> list[str]:
    """The modules the image's RUN line asks the install script to import."""
    run = next(r for r in Dockerfile.of(image).all("RUN") if "install-gpuyard.sh" in r)
    words = shlex.split(run.split("&&")[0])
    return words[words.index(next(w for w in words if w.endswith("install-gpuyard.sh"))) + 2:]


# An image build sees no PYTHONPATH (a checkout on it would hide the installed copy).
BUILD_ENV = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}


def install(python: Path, context: Path, modules: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", str(INSTALL), str(context), *modules], env={**BUILD_ENV, "PYTHON": str(python)},
                          capture_output=True, text=True, timeout=300, cwd=cwd)


def test_installs_the_package_without_its_infra_dependencies(base_python, tmp_path):
    modules = install_modules("ddp")
    assert modules == ["gpuyard.jobs.workload.train"] == install_modules("mpi")
    result = install(base_python, build_context(tmp_path), modules, tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    where = subprocess.run([str(base_python), "-c", "import gpuyard.jobs as j; print(j.__file__)"], capture_output=True,
                           text=True, cwd="/", env=BUILD_ENV, check=True).stdout
    assert where.startswith(str(tmp_path / "base"))  # the installed copy, not this checkout
    installed = {p.name.split("-")[0].lower() for p in (tmp_path / "base").rglob("*.dist-info")}
    assert installed == {"gpuyard"}
    # one top-level name, which no user's script is likely to have: their jobs/ or sim.py shadows nothing of ours
    [dist_info] = (tmp_path / "base").rglob("gpuyard-*.dist-info")
    assert {p.name for p in dist_info.parent.iterdir() if p.suffix not in (".dist-info", ".pth")} == {"gpuyard"}
    assert sorted(p.name for p in (dist_info.parent / "gpuyard").iterdir()) == ["infra", "jobs"]  # no sim/ in images


def test_a_base_with_another_torch_fails_the_build(base_python, tmp_path):
    context = build_context(tmp_path)
    pyproject = context / "pyproject.toml"
    text = pyproject.read_text()
    pin = re.search(r'"torch==([^"]+)"', text)[1]
    pyproject.write_text(text.replace(f'"torch=={pin}"', '"torch==0.0.1"'))
    result = install(base_python, context, ["gpuyard.jobs.workload.train"], tmp_path)
    assert result.returncode != 0
    assert "pyproject.toml pins 0.0.1" in result.stderr


def test_the_ray_image_checks_modules_that_import_here():
    """The Ray image's build imports the Ray Train entry and TorchTrainer (the base brings Ray)."""
    modules = install_modules("ray")
    assert modules == ["gpuyard.jobs.workload.ray_entry", "ray.train.torch"]
    for module in modules:
        importlib.import_module(module)
