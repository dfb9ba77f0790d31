"""sim/build.py: a component's build is reused only while its recipe is the same, and its patches are in what it
builds. gosh (the init image's shell, a 2-second build) stands for every component; `go build` runs for real."""

from __future__ import annotations

import dataclasses
import json
import subprocess

import pytest

from gpuyard.sim import build
from gpuyard.sim.paths import BUILD_RECORD, built
from gpuyard.sim.versions import INIT_SHELL, Patch

pytestmark = pytest.mark.skipif(not build.go_available(), reason="needs Go")

USAGE = "command to be executed"  # mvdan.cc/sh v3.14.1 cmd/gosh/main.go, the -c flag's usage


def usage(folder) -> str:
    shown = subprocess.run([str(folder / "gosh"), "-h"], capture_output=True, text=True)
    return shown.stdout + shown.stderr


def test_a_changed_patch_rebuilds_the_component_with_it_and_a_patch_that_no_longer_applies_fails_naming_it(
        tmp_path, monkeypatch):
    monkeypatch.setenv("GPUYARD_CACHE", str(tmp_path))
    plain = build.build_component(INIT_SHELL, print)
    assert built(INIT_SHELL) == plain
    assert json.loads((plain / BUILD_RECORD).read_text())["recipe"] == INIT_SHELL.recipe
    assert f"{USAGE}\n" in usage(plain)

    patched = dataclasses.replace(INIT_SHELL, patches=(
        Patch("mvdan.cc/sh/v3", "cmd/gosh/main.go", f'"{USAGE}"', f'"{USAGE} (patched)"'),))
    assert patched.recipe != INIT_SHELL.recipe
    assert built(patched) is None  # same name and version, another recipe: not reused
    assert build.build_component(patched, print) == plain
    assert f"{USAGE} (patched)" in usage(plain)
    assert built(INIT_SHELL) is None and built(patched) == plain

    stale = dataclasses.replace(INIT_SHELL, patches=(Patch("mvdan.cc/sh/v3", "cmd/gosh/main.go", "no such text", "x"),))
    with pytest.raises(build.BuildError, match="cmd/gosh/main.go: 'no such text' not found"):
        build.build_component(stale, print)
    assert built(patched) == plain  # the last good build stays
