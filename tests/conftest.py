"""Shared fixtures: a real moto_server subprocess, stacks that name their image registry, and the project's paths."""

from pathlib import Path

import pytest
import yaml

from gpuyard.infra.config import STACKS_DIR_ENV, StackConfig, stacks_dir
from gpuyard.jobs.local_aws import LocalAWS
from gpuyard.jobs.processes import interrupt_on_sigterm

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
VALIDATE_MANIFESTS = SHARED / "tools" / "validate-manifests"
ACCOUNT = "123456789012"


def pytest_configure(config):
    """SIGTERM ends a test run as Ctrl-C does, so fixtures still stop their servers (moto_server, clusters)."""
    interrupt_on_sigterm()


def ecr_registry(config: StackConfig) -> str:
    """The registry ``pulumi stack output ecr_repositories`` names for a stack, in the test account."""
    return f"{ACCOUNT}.dkr.ecr.{config.region}.amazonaws.com/{config.cluster_name}"


def with_registry(config: StackConfig) -> StackConfig:
    """``config`` as if gpuyard:image_registry were set to its ECR registry."""
    return config.model_copy(update={"image_registry": ecr_registry(config)})


@pytest.fixture(scope="session")
def registry_stacks(tmp_path_factory) -> Path:
    """A copy of stacks/ whose stacks set gpuyard:image_registry (their ECR registry in the test account)."""
    from gpuyard.infra.config import load_stack

    folder = tmp_path_factory.mktemp("stacks")
    for path in stacks_dir().glob("Pulumi.*.yaml"):
        document = yaml.safe_load(path.read_text())
        config = load_stack(path.name[len("Pulumi."):-len(".yaml")])
        document["config"]["gpuyard:image_registry"] = ecr_registry(config)
        (folder / path.name).write_text(yaml.safe_dump(document))
    return folder


@pytest.fixture
def stacks_with_registry(registry_stacks, monkeypatch) -> Path:
    """Point this process and the commands it runs at the stacks that name their registry."""
    monkeypatch.setenv(STACKS_DIR_ENV, str(registry_stacks))
    return registry_stacks


@pytest.fixture
def local_aws(tmp_path, monkeypatch):
    """A fresh moto_server on 127.0.0.1 with boto3 in this process pointed at it."""
    with LocalAWS(log_path=tmp_path / "moto.log") as aws:
        for key, value in aws.env.items():
            monkeypatch.setenv(key, value)
        yield aws


@pytest.fixture(scope="session")
def validate_manifests():
    """Path of ../shared/tools/validate-manifests; skips when ../shared is absent."""
    if not VALIDATE_MANIFESTS.exists():
        pytest.skip(f"../shared is absent ({VALIDATE_MANIFESTS} not found): official CRD schemas unavailable")
    return VALIDATE_MANIFESTS
