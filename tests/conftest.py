"""Shared fixtures: a real moto_server subprocess and the project's paths."""

from pathlib import Path

import pytest

from jobs.local_aws import LocalAWS

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
VALIDATE_MANIFESTS = SHARED / "tools" / "validate-manifests"


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
