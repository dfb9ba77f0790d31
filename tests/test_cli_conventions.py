"""The habits users bring from kubectl and pulumi: --version, -h, completion, choices, formats, flat folders."""

from __future__ import annotations

import json
import os
import re
import stat

import pytest
import yaml

from cli_helpers import gpuyard
from gpuyard.jobs.cli.options import gpuyard_version
from gpuyard.jobs.render import write_manifests


@pytest.fixture(autouse=True)
def registries(stacks_with_registry):
    """The stacks as they are once gpuyard:image_registry names their ECR registry."""

COMMANDS = [["render"], ["demo"], ["plan"], ["images", "build"], ["env", "create"], ["env", "list"],
            ["env", "destroy"], ["env", "reap"], ["env", "cleanup"]]


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version(flag):
    result = gpuyard(flag)
    assert result.returncode == 0 and result.stdout == f"gpuyard {gpuyard_version()}\n"
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", gpuyard_version())


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_with_h_shows_defaults_and_choices_and_no_bool_metavar(command):
    result = gpuyard(*command, "-h")
    assert result.returncode == 0, result.stderr
    assert result.stdout == gpuyard(*command, "--help").stdout
    assert "<bool>" not in result.stdout and "-h, --help" in result.stdout


def test_render_help_lists_the_choices_and_defaults():
    text = " ".join(gpuyard("render", "-h").stdout.split())
    for shown in ("--stack <dev|ephemeral|prod>", "--kind <pytorchjob|mpijob|rayjob|volcanojob|trainjob>",
                  "--capacity-type <on-demand|spot>", "-o, --output <yaml|json>", "[default: on-demand]",
                  "[default: yaml]", "[default: dev]", "--all Every kind"):
        assert shown in text, shown


def test_completion_is_offered():
    """For bash, named: by default Typer takes the shell from this process's ancestors (shellingham), and a pytest
    started detached (setsid, nohup) has none, "Shell  not supported."; Typer's own switch makes the shell a value."""
    result = gpuyard("--show-completion", "bash", env={"SHELL": "/bin/bash",
                                                       "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"})
    assert result.returncode == 0 and "complete" in result.stdout and "_GPUYARD_COMPLETE" in result.stdout.upper()


def test_yaml_on_stdout_starts_with_the_provenance_comment():
    result = gpuyard("render", "--team", "nlp", "--kind", "mpijob", "--nodes", "3")
    assert result.returncode == 0, result.stderr
    first = result.stdout.splitlines()[0]
    assert first == (f"# Rendered by gpuyard {gpuyard_version()} from stack dev: "
                     "gpuyard render --team nlp --kind mpijob --nodes 3")
    assert yaml.safe_load(result.stdout)["kind"] == "MPIJob"


def test_json_is_a_format_on_stdout_and_writes_no_folder(tmp_path):
    one = gpuyard("render", "--team", "nlp", "--kind", "mpijob", "-o", "json", cwd=tmp_path)
    assert one.returncode == 0, one.stderr
    assert json.loads(one.stdout)["kind"] == "MPIJob"
    every = gpuyard("render", "--all", "-o", "json", cwd=tmp_path)
    document = json.loads(every.stdout)
    assert (document["kind"], len(document["items"])) == ("List", 10)
    assert list(tmp_path.iterdir()) == []


def test_output_dir_is_one_flat_folder_kubectl_applies_without_recursion(tmp_path):
    result = gpuyard("render", "--all", "-d", "manifests", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    entries = sorted((tmp_path / "manifests").iterdir())
    assert len(entries) == 10 and all(path.is_file() and path.suffix == ".yaml" for path in entries)
    for path in entries:
        assert path.read_text().startswith(f"# Rendered by gpuyard {gpuyard_version()} from stack dev: ")


def test_a_failed_write_into_an_existing_folder_puts_back_what_was_there(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "a.yaml").write_text("old a\n")
    (out / "c.yaml").mkdir()  # the third file cannot be written: its name is taken by a folder
    with pytest.raises(IsADirectoryError):
        write_manifests({name: {"kind": name} for name in ("a.yaml", "b.yaml", "c.yaml")}, out)
    assert sorted(p.name for p in out.iterdir()) == ["a.yaml", "c.yaml"]
    assert (out / "a.yaml").read_text() == "old a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no staging folder left


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_folder_gets_nothing(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        with pytest.raises(PermissionError):
            write_manifests({"a.yaml": {"kind": "A"}}, out)
        assert list(out.iterdir()) == []
    finally:
        out.chmod(stat.S_IRWXU)


def test_render_all_into_a_blocked_folder_is_one_line_and_leaves_it_as_it_was(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "vision-mpijob.yaml").write_text("mine\n")
    (out / "nlp-trainjob.yaml").mkdir()
    result = gpuyard("render", "--all", "-d", str(out))
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
    assert "--output-dir" in result.stderr and "nlp-trainjob.yaml" in result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["nlp-trainjob.yaml", "vision-mpijob.yaml"]
    assert (out / "vision-mpijob.yaml").read_text() == "mine\n"
