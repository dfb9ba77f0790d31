"""Running ``gpuyard`` as users do (a real process) and checking the one-line error contract."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GPUYARD = [sys.executable, "-m", "jobs.cli.main"]


def gpuyard(*args: str, cwd: Path = REPO, env: dict | None = None, timeout: float = 120,
            stdin: str | None = None) -> subprocess.CompletedProcess:
    variables = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200", **(env or {})}
    return subprocess.run([*GPUYARD, *args], capture_output=True, text=True, cwd=cwd, env=variables,
                          timeout=timeout, input=stdin if stdin is not None else "")


def assert_one_line_error(result: subprocess.CompletedProcess, *names: str) -> str:
    """Exit 2, exactly one stderr line starting ``gpuyard: error:`` that contains every one of ``names``."""
    assert result.returncode == 2, (result.returncode, result.stdout[-2000:], result.stderr[-2000:])
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuyard: error: "), result.stderr
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]
