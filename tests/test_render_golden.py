"""Golden manifests: what `gpuyard render --stack dev --all` writes, one file per kind and team.

Rewrite them with GPUYARD_UPDATE_GOLDEN=1 and review the diff like code.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import with_registry
from gpuyard.infra.config import load_stack
from gpuyard.jobs.render import default_specs, render, render_all, to_yaml
from gpuyard.jobs.spec import KINDS

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("GPUYARD_UPDATE_GOLDEN") == "1"
DEV = with_registry(load_stack("dev"))  # what the templates render once the stack names its ECR registry
SPECS = default_specs(DEV)


def golden_path(spec) -> Path:
    return GOLDEN / spec.kind / f"{spec.team}.yaml"


@pytest.mark.parametrize("spec", SPECS, ids=lambda spec: f"{spec.kind}-{spec.team}")
def test_matches_golden(spec):
    text = to_yaml(render(spec, DEV.team(spec.team)))
    path = golden_path(spec)
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with GPUYARD_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{path} differs: review, then rewrite with GPUYARD_UPDATE_GOLDEN=1"


def test_every_golden_is_rendered():
    goldens = [path for kind in KINDS for path in (GOLDEN / kind).glob("*.yaml")]
    assert sorted(goldens) == sorted(golden_path(spec) for spec in SPECS)


def test_goldens_pass_the_official_schemas(validate_manifests):
    result = subprocess.run([sys.executable, str(validate_manifests), "--strict", *(str(GOLDEN / k) for k in KINDS)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(SPECS)} passed, 0 failed" in result.stdout


def test_render_all_writes_the_goldens(tmp_path):
    written = render_all(DEV, tmp_path / "out")
    assert len(written) == len(SPECS)
    by_name = {path.name: path.read_text() for path in written}
    for spec in SPECS:
        assert by_name[f"{spec.name}.yaml"] == golden_path(spec).read_text()


def test_rendering_is_byte_stable():
    spec = SPECS[0]
    assert to_yaml(render(spec, DEV.team(spec.team))) == to_yaml(render(spec, DEV.team(spec.team)))
