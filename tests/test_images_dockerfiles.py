"""The Dockerfiles are lint-clean, pinned, non-root, and install what the trainer imports."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions, requires, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from dockerfile_parse import IMAGES, REPO, Dockerfile, dockerfiles
from gpuyard.infra.conventions import IMAGE_NAMES, METRICS_PORT
from gpuyard.jobs.workload.args import RAY_MODULE, TRAIN_MODULE, parse_args

HADOLINT = Path(sys.executable).parent / "hadolint"
OCI_LABELS = ("title", "description", "version", "revision", "licenses", "base.name")
REQUIREMENTS = IMAGES / "common" / "requirements.txt"
# What each image must be able to import, and the distributions its base image brings.
IMAGE_MODULES = {"ddp": TRAIN_MODULE, "mpi": TRAIN_MODULE, "ray": RAY_MODULE}
BASE_PROVIDES = {"ddp": {"torch"}, "mpi": {"torch"}, "ray": {"torch", "ray"}}  # ray's torch: the install script


def pyproject_dependencies() -> dict[str, Requirement]:
    document = tomllib.loads((REPO / "pyproject.toml").read_text())
    requirements = [Requirement(line) for line in document["project"]["dependencies"]]
    requirements += [Requirement(line) for line in document["project"]["optional-dependencies"]["ray"]]
    return {canonicalize_name(r.name): r for r in requirements}


def test_every_image_name_has_a_dockerfile():
    assert dockerfiles() == sorted(IMAGE_NAMES)


@pytest.mark.parametrize("image", IMAGE_NAMES)
def test_hadolint_passes_with_the_oci_labels_required(image):
    labels = [arg for label in OCI_LABELS for arg in ("--require-label", f"org.opencontainers.image.{label}:text")]
    result = subprocess.run([str(HADOLINT), "--no-color", "-f", "json", *labels, str(Dockerfile.of(image).path)],
                            capture_output=True, text=True, cwd=REPO, timeout=60)
    assert json.loads(result.stdout or "[]") == [], result.stdout
    assert result.returncode == 0, result.stderr


def test_hadolint_ignores_sit_next_to_a_written_reason():
    """No global config: every ignore is an inline pragma preceded by a comment naming the rule and why."""
    assert not [p for p in REPO.glob(".hadolint.y*ml")], "keep ignores inline, next to their reason"
    pragmas = 0
    for path in IMAGES.glob("*/Dockerfile"):
        lines = path.read_text().splitlines()
        for number, line in enumerate(lines):
            match = re.match(r"#\s*hadolint\s+ignore=(\S+)", line.strip())
            if not match:
                continue
            pragmas += 1
            reason_block = []
            for previous in reversed(lines[:number]):
                if not previous.startswith("#") or "hadolint" in previous:
                    break
                reason_block.insert(0, previous.lstrip("# "))
            reason = " ".join(reason_block)
            for rule in match[1].split(","):
                assert rule in reason and len(reason.split()) >= 8, f"{path}:{number + 1}: {rule} ignored without a reason"
    assert pragmas, "the test saw no pragma; if none is left, delete this check rather than let it pass vacuously"


@pytest.mark.parametrize("image", IMAGE_NAMES)
def test_base_image_is_a_pinned_version(image):
    base = Dockerfile.of(image).base_image()
    name, _, tag = base.rpartition(":")
    assert name and re.match(r"\d+\.\d+\.\d+-", tag), f"{base} is not pinned to a release"


def test_pytorch_bases_ship_the_pinned_torch():
    pin = pyproject_dependencies()["torch"].specifier
    for image in ("ddp", "mpi"):
        assert Dockerfile.of(image).arg_defaults()["PYTORCH_VERSION"] in pin


def test_ray_base_is_the_ray_and_python_the_tests_run():
    import ray

    defaults = Dockerfile.of("ray").arg_defaults()
    assert defaults["RAY_VERSION"] == ray.__version__
    assert defaults["RAY_PYTHON"] == f"py{sys.version_info.major}{sys.version_info.minor}"
    assert defaults["RAY_VERSION"] in pyproject_dependencies()["ray"].specifier


@pytest.mark.parametrize("image", IMAGE_NAMES)
def test_runs_as_a_numeric_non_root_user(image):
    """Numeric, so a pod's runAsNonRoot can be checked by the kubelet."""
    dockerfile = Dockerfile.of(image)
    user, _, group = dockerfile.expand(dockerfile.all("USER")[-1]).partition(":")
    assert user.isdigit() and int(user) > 0 and group.isdigit()


@pytest.mark.parametrize("image", IMAGE_NAMES)
def test_exposes_the_metrics_port(image):
    assert str(METRICS_PORT) in " ".join(Dockerfile.of(image).all("EXPOSE")).split()


@pytest.mark.parametrize(("image", "module"), [("ddp", TRAIN_MODULE), ("ray", RAY_MODULE)])
def test_default_command_is_the_canonical_trainer_command_line(image, module):
    command = Dockerfile.of(image).command()
    argv = command[command.index(module) + 1:]
    if image == "ray":
        assert argv[-2:] == ["--num-workers", "2"]
        argv = argv[:-2]
    assert parse_args(argv).to_argv() == argv


def test_ddp_and_ray_default_to_the_same_training():
    ddp, ray = Dockerfile.of("ddp").command(), Dockerfile.of("ray").command()
    assert ddp[ddp.index(TRAIN_MODULE) + 1:] == ray[ray.index(RAY_MODULE) + 1:-2]


def test_mpi_entrypoint_finds_its_sshd_config_beside_it_in_the_image():
    dockerfile = Dockerfile.of("mpi")
    copies = dockerfile.copies()
    entrypoint = dockerfile.exec_form("ENTRYPOINT")[0]
    assert copies[entrypoint] == "images/mpi/entrypoint.sh"
    assert copies[str(Path(entrypoint).parent / "sshd_config")] == "images/mpi/sshd_config"


def test_mpi_ssh_client_and_server_agree_on_the_port():
    def port(path: Path) -> str:
        return re.search(r"^\s*Port\s+(\d+)", path.read_text(), re.M)[1]

    server, client = port(IMAGES / "mpi" / "sshd_config"), port(IMAGES / "mpi" / "ssh_config")
    assert server == client
    assert server in " ".join(Dockerfile.of("mpi").all("EXPOSE")).split()


def test_mpi_installs_openmpi_ucx_openssh_and_tini():
    installs = " ".join(Dockerfile.of("mpi").all("RUN"))
    for package in ("openmpi-bin", "libucx0", "ucx-utils", "openssh-server", "openssh-client", "tini"):
        assert f" {package} " in f" {installs} "


@pytest.mark.parametrize("image", ["ddp", "mpi"])
def test_gpu_images_carry_libfabric_and_aws_ofi_nccl_pinned_on_the_library_path(image):
    """Without both NCCL silently trains EFA jobs over TCP sockets."""
    dockerfile = Dockerfile.of(image)
    defaults = dockerfile.arg_defaults()
    assert re.fullmatch(r"\d+\.\d+\.\d+", defaults["EFA_INSTALLER_VERSION"])
    assert re.fullmatch(r"\d+\.\d+\.\d+", defaults["AWS_OFI_NCCL_VERSION"])
    runs = " ".join(dockerfile.all("RUN"))
    assert 'install-efa.sh plugin "${EFA_INSTALLER_VERSION}" "${AWS_OFI_NCCL_VERSION}"' in runs
    assert 'install-efa.sh runtime "${EFA_INSTALLER_VERSION}"' in runs
    assert "--from=efa /opt/aws-ofi-nccl /opt/aws-ofi-nccl" in dockerfile.all("COPY")
    assert dockerfile.env()["LD_LIBRARY_PATH"].startswith("/opt/aws-ofi-nccl/lib:/opt/amazon/efa/lib")
    script = (IMAGES / "common" / "install-efa.sh").read_text()
    assert "--skip-kmod" in script and "--with-libfabric=/opt/amazon/efa" in script


def test_dockerignore_lets_in_only_the_package_and_images():
    patterns = [line for line in (REPO / ".dockerignore").read_text().splitlines() if line and not line.startswith("#")]
    assert patterns[0] == "*"
    assert {p for p in patterns if p.startswith("!")} == {"!pyproject.toml", "!setup.py", "!README.md", "!infra/", "!jobs/",
                                                                "!images/"}


def test_no_key_material_under_images():
    secrets = [p for p in IMAGES.rglob("*") if p.is_file()
               and ("PRIVATE KEY" in p.read_text(errors="ignore") or p.suffix in (".pem", ".key") or p.name.startswith("id_"))]
    assert not secrets


def _requirements() -> dict[str, str]:
    lines = [line.strip() for line in REQUIREMENTS.read_text().splitlines() if line.strip() and not line.startswith("#")]
    pins = dict(line.split("==") for line in lines)
    assert len(pins) == len(lines), "every requirement is name==version"
    return {canonicalize_name(name): pin for name, pin in pins.items()}


def test_requirements_pin_what_the_tests_run_within_pyproject():
    declared = pyproject_dependencies()
    for name, pin in _requirements().items():
        assert pin == version(name), f"{name}: the image pins {pin}, the tests run {version(name)}"
        assert pin in declared[name].specifier, f"{name}=={pin} is outside pyproject.toml's {declared[name]}"


def _third_party_imports(module: str) -> set[str]:
    """Top-level names of the non-project, non-stdlib modules ``module`` imports, following project imports."""
    seen, outside, todo = set(), set(), [module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = REPO / Path(*name.split(".")[1:])  # gpuyard.jobs.x is jobs/x (pyproject.toml's package-dir)
        source = path.with_suffix(".py") if path.with_suffix(".py").exists() else path / "__init__.py"
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            for imported in names:
                top = imported.split(".")[0]
                if top == "gpuyard":
                    candidate = REPO / Path(*imported.split(".")[1:])
                    if candidate.with_suffix(".py").exists() or (candidate / "__init__.py").exists():
                        todo.append(imported)
                elif top not in sys.stdlib_module_names and top != "__future__":
                    outside.add(top)
    return outside


def _with_dependencies(names: set[str]) -> set[str]:
    """``names`` and everything they require when installed without extras (pip's closure)."""
    closure, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in closure:
            continue
        closure.add(name)
        for line in requires(name) or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(canonicalize_name(requirement.name))
    return closure


@pytest.mark.parametrize("image", IMAGE_NAMES)
def test_image_installs_every_distribution_its_trainer_imports(image):
    dists = packages_distributions()
    needed = {canonicalize_name(dists[top][0]) for top in _third_party_imports(IMAGE_MODULES[image])}
    missing = needed - _with_dependencies(set(_requirements())) - BASE_PROVIDES[image]
    assert not missing, f"{image}: add {sorted(missing)} to {REQUIREMENTS.relative_to(REPO)}"
    assert "torch" in needed
