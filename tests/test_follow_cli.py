"""`gpuyard submit/status/list/cancel/logs` before any cluster answers: what the user typed and where the cluster is,
one line each (exit 2), and a cluster that cannot be reached (exit 1). tests/test_sim_follow.py runs them on a cluster."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuyard.infra.config import load_stack
from gpuyard.sim.cluster import Sim

HINT = "(EKS: pulumi stack output kubeconfig; simulated: gpuyard sim kubeconfig)"
KUBECTL = shutil.which("kubectl") or Sim("dev").kubectl_binary()


def gpuyard(*args: str, home: Path, **env: str) -> subprocess.CompletedProcess:
    environ = {key: value for key, value in os.environ.items() if key != "KUBECONFIG"}
    return subprocess.run([sys.executable, "-m", "gpuyard.jobs.cli.main", *args], capture_output=True, text=True, timeout=120,
                          env={**environ, "HOME": str(home), **env})


COMMANDS = [["list"], ["status"], ["status", "job"], ["cancel", "job"], ["logs", "job"],
            ["submit", "--kind", "pytorchjob", "--", "train.py"]]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_without_a_kubeconfig_each_command_says_where_to_get_one(command, tmp_path):
    result = gpuyard(command[0], "--team", "vision", *command[1:], home=tmp_path)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr == f"gpuyard: error: no kubeconfig: pass --kubeconfig FILE or set KUBECONFIG {HINT}\n"


@pytest.mark.parametrize(("env", "message"), [
    ({"KUBECONFIG": "/nonexistent/config"}, "--kubeconfig /nonexistent/config: no such file"),
    ({"KUBECONFIG": "/a/config:/b/config"}, "KUBECONFIG /a/config:/b/config lists several files: pass one with "
                                            "--kubeconfig FILE"),
])
def test_a_kubeconfig_that_is_no_file_is_one_line_exit_2(tmp_path, env, message):
    result = gpuyard("list", "--team", "vision", home=tmp_path, **env)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and message in result.stderr, result.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["list", "--team", "nobody"], "unknown team 'nobody'"),
    (["list"], "Missing option '--team'"),
    (["submit", "--kind", "mpijob", "--", "t.py"], "--team is required"),
    (["submit", "--team", "vision", "--kind", "mpijob", "-d", "out", "--", "t.py"], "-d: submit creates one job"),
    (["submit", "--team", "vision", "--kind", "mpijob", "--all"], "--all: submit creates one job"),
])
def test_what_the_user_typed_is_checked_first(tmp_path, args, message):
    result = gpuyard(*args, home=tmp_path)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and message in result.stderr, result.stderr


@pytest.mark.skipif(not Path(KUBECTL).is_file(), reason="no kubectl on PATH nor a gpuyard sim build")
def test_a_cluster_that_does_not_answer_is_one_line_exit_1(tmp_path):
    """A kubeconfig whose server is a closed port on this machine: kubectl's reason, on one line."""
    closed = 1  # tcpmux: nothing listens on it here
    config = tmp_path / "config"
    config.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "https://127.0.0.1:{closed}", insecure-skip-tls-verify: true}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
""")
    result = gpuyard("list", "--team", "vision", "--kubeconfig", str(config), home=tmp_path)
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert f"cannot reach the cluster of {config}: " in result.stderr and "refused" in result.stderr
