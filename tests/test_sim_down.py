"""`gpuyard sim` deletes only what `sim up` made: a stack name never becomes a path, a folder it did not claim is left
alone (its processes too). No simulated cluster is started here: the state folders are made by hand or by ``claim``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from cli_helpers import assert_one_line_error, gpuyard_forked, tree
from gpuyard.jobs.processes import alive
from gpuyard.sim.addons import OUTSIDE
from gpuyard.sim.cluster import NotOurs, Sim
from gpuyard.sim.paths import OWNER_FILE, claim, state_dir, state_root

# Names a user might pass as --stack that must never reach the file system.
BAD_NAMES = ["", " ", ".", "..", "../..", "../../..", "/", "/tmp", "./dev", "dev/", "dev/../..", "dev/..", "~", "*",
             "dev ", " dev", "DEV", "Dev", "dev\n", "dev\t", "-dev", "dev-", "de_v", "dev.yaml", "Pulumi.dev.yaml",
             "a" * 64, "state/..", "..\\..", "dév", "dev;rm", "$HOME", "%2e%2e"]
UNKNOWN_NAMES = ["bin", "state", "sim", "victim", "nope"]  # valid names, no stack file: unknown stacks
SIM_COMMANDS = [["down"], ["status"], ["status", "--json"], ["kubeconfig"], ["up"], ["submit", "job.yaml"]]


@pytest.fixture
def cache(tmp_path) -> Path:
    """A $GPUYARD_CACHE with a build folder and another stack's state in it, which no bad name may touch."""
    root = tmp_path / "cache"
    for folder in ("sim/bin/kubernetes-v1", "sim/state/prod/logs", "victim/data"):
        (root / folder).mkdir(parents=True)
        (root / folder / "keep.txt").write_text("precious")
    return root


def _run(cache: Path, cwd: Path, *args: str):
    return gpuyard_forked("sim", *args, cwd=cwd, env={"GPUYARD_CACHE": str(cache)})


@pytest.mark.parametrize("command", SIM_COMMANDS, ids=" ".join)
@pytest.mark.parametrize("name", BAD_NAMES + UNKNOWN_NAMES, ids=repr)
def test_a_bad_stack_name_is_refused_before_anything_is_touched(tmp_path, cache, command, name):
    work = tmp_path / "work"
    work.mkdir()
    (work / "job.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    before, files = tree(tmp_path), tree(work)
    result = _run(cache, work, *command, "--stack", name)
    assert_one_line_error(result, "--stack")
    assert tree(tmp_path) == before and tree(work) == files
    assert result.stdout == "" and result.session_left == []


@pytest.mark.parametrize("target", ["victim", "sim/bin", "sim/state/prod", "sim", "."])
def test_down_never_follows_a_name_to_another_folder(tmp_path, cache, target):
    """The issue's data loss: --stack as a path (absolute, relative, empty) deleted that folder."""
    before = tree(tmp_path)
    for name in (str(cache / target), os.path.relpath(cache / target, tmp_path), f"../{target}", ""):
        assert_one_line_error(_run(cache, tmp_path, "down", "--stack", name), "--stack")
    assert tree(tmp_path) == before


def test_a_state_folder_sim_up_did_not_make_is_left_alone_with_its_processes(tmp_path, cache, monkeypatch):
    monkeypatch.setenv("GPUYARD_CACHE", str(cache))
    state = cache / "sim" / "state" / "dev"
    state.mkdir(parents=True)
    (state / "notes.txt").write_text("mine")
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        (state / "pids.json").write_text(json.dumps({"victim": sleeper.pid}))
        before = tree(cache)
        result = _run(cache, tmp_path, "down", "--stack", "dev")
        assert_one_line_error(result, str(state), "left alone", code=1)
        assert tree(cache) == before and alive(sleeper.pid)
        with pytest.raises(NotOurs, match="left alone"):  # up would replace it: refused before anything is built
            Sim("dev").up(lambda line: pytest.fail(f"up went on: {line}"))
        assert tree(cache) == before and alive(sleeper.pid)
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.parametrize("forgery", ["marker of another folder", "symlink to a claimed folder", "marker is a symlink",
                                     "marker is a folder", "empty marker"])
def test_a_forged_claim_is_not_a_claim(tmp_path, cache, monkeypatch, forgery):
    monkeypatch.setenv("GPUYARD_CACHE", str(cache))
    state, elsewhere = state_dir("dev"), tmp_path / "elsewhere"
    claim(elsewhere, elsewhere)
    (elsewhere / "data.txt").write_text("precious")
    if forgery == "symlink to a claimed folder":
        state.parent.mkdir(parents=True, exist_ok=True)
        state.symlink_to(elsewhere)
    else:
        state.mkdir(parents=True)
        marker = state / OWNER_FILE
        if forgery == "marker of another folder":
            marker.write_text(f"{elsewhere}\n")
        elif forgery == "marker is a symlink":
            marker.symlink_to(elsewhere / OWNER_FILE)
        elif forgery == "marker is a folder":
            marker.mkdir()
        else:
            marker.write_text("")
    before = tree(tmp_path)
    with pytest.raises(NotOurs, match="left alone"):
        Sim("dev").down()
    assert tree(tmp_path) == before


def test_down_stops_and_removes_what_up_claimed_and_only_claimed_outside_folders(tmp_path, cache, monkeypatch):
    monkeypatch.setenv("GPUYARD_CACHE", str(cache))
    state = state_dir("dev")
    claim(state, state)
    ours, theirs = tmp_path / "outside-ours", tmp_path / "outside-theirs"
    claim(ours, state)
    theirs.mkdir()
    (theirs / "keep.txt").write_text("someone else's")
    (state / OUTSIDE).write_text(json.dumps([str(ours), str(theirs), str(cache / "victim"), "/"]))
    server = subprocess.Popen(["sleep", "60"], start_new_session=True)
    (state / "pids.json").write_text(json.dumps({"server": server.pid}))
    result = _run(cache, tmp_path, "down", "--stack", "dev")
    assert (result.returncode, result.stdout, result.stderr) == (0, "sim dev: down\n", "")
    assert server.wait(timeout=30) == -signal.SIGTERM
    assert not state.exists() and not ours.exists()
    assert (theirs / "keep.txt").read_text() == "someone else's"
    assert (cache / "victim" / "data" / "keep.txt").read_text() == "precious"
    assert (state_root() / "prod" / "logs" / "keep.txt").read_text() == "precious"


def test_down_of_a_stack_that_never_ran_changes_nothing(tmp_path, cache):
    before = tree(tmp_path)
    result = _run(cache, tmp_path, "down", "--stack", "dev")
    assert (result.returncode, result.stdout, result.stderr) == (0, "sim dev: down\n", "")
    assert tree(tmp_path) == before


def test_up_claims_a_new_state_folder_only(tmp_path):
    state = tmp_path / "state"
    claim(state, state)
    with pytest.raises(FileExistsError):
        claim(state, state)
    assert (state / OWNER_FILE).read_text() == f"{state}\n"


def test_state_dir_takes_stack_names_only(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUYARD_CACHE", str(tmp_path))
    assert state_dir("pr-7") == tmp_path / "sim" / "state" / "pr-7"
    for name in BAD_NAMES:
        with pytest.raises(ValueError, match="bad stack name"):
            state_dir(name)
    assert list(tmp_path.iterdir()) == []
