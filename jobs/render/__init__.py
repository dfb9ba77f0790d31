"""Render JobSpecs into operator manifests: one small module per kind, one pod builder.

``render(spec, team)`` returns the manifest as a dict, ``to_yaml`` its bytes-stable text,
``render_all(config, out_dir)`` writes every kind the stack runs for every team (default sizes)
and ``write_manifests`` puts all files in place or none.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import yaml

from gpuyard.infra.config import StackConfig, Team
from gpuyard.infra.signals import signals_deferred
from gpuyard.jobs.render import mpijob, pytorchjob, rayjob, trainjob, volcanojob
from gpuyard.jobs.placement import place, stack_pools
from gpuyard.jobs.spec import JobSpec, Kind, build_spec, stack_kinds

RENDERERS: dict[Kind, Callable[[JobSpec, Team], dict]] = {
    "pytorchjob": pytorchjob.render,
    "mpijob": mpijob.render,
    "rayjob": rayjob.render,
    "volcanojob": volcanojob.render,
    "trainjob": trainjob.render,
}
# libyaml folds scalars longer than its line width, a C int: the largest one means never.
_NO_FOLDING = 2**31 - 1


def render(spec: JobSpec, team: Team) -> dict:
    """The manifest of ``spec`` for ``team`` (which must be the spec's team)."""
    if spec.team != team.name:
        raise ValueError(f"spec of team {spec.team!r} rendered for team {team.name!r}")
    return RENDERERS[spec.kind](spec, team)


def to_yaml(manifest: dict) -> str:
    """Block-style YAML through libyaml, keys in insertion order and no line folding, so the same manifest is
    always the same bytes."""
    return yaml.dump(manifest, Dumper=yaml.CSafeDumper, sort_keys=False, width=_NO_FOLDING)


def manifest_path(spec: JobSpec) -> Path:
    """Where a job's manifest goes inside an output folder: ``<name>.yaml``, one flat folder, so
    ``kubectl apply -f DIR`` takes it without ``-R`` (default names start with the team)."""
    return Path(f"{spec.name}.yaml")


def default_specs(config: StackConfig) -> list[JobSpec]:
    """One job of each kind the stack runs, per team, at the default size, placed on the stack."""
    pools = stack_pools(config)
    return [place(config, build_spec(config, team, kind), pools) for team in config.teams for kind in stack_kinds(config)]


def write_manifests(rendered: dict[Path, dict], out_dir: Path, header: str = "") -> list[Path]:
    """Write ``{file name: manifest}`` into ``out_dir``, each file starting with ``header``: all or nothing.

    Files are written to a temporary folder beside ``out_dir`` first. A new ``out_dir`` is that folder
    renamed; into an existing one each file is renamed in place, and a failure puts back what was
    there and removes the parent folders it made. SIGINT/SIGTERM wait until the files are in place.
    """
    made = [folder for folder in (out_dir.parent, *out_dir.parent.parents) if not folder.exists()]
    staging = None
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}."))
        for name, manifest in rendered.items():
            (staging / name).write_text(header + to_yaml(manifest))
        with signals_deferred():
            if out_dir.exists():
                _replace_files(staging, list(rendered), out_dir)
            else:
                os.rename(staging, out_dir)
    except BaseException:
        if staging:
            shutil.rmtree(staging, ignore_errors=True)
        for folder in made:  # deepest first; only the empty folders it made
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise
    finally:
        if staging:
            shutil.rmtree(staging, ignore_errors=True)
    return [out_dir / name for name in rendered]


def _replace_files(staging: Path, names: list[Path], out_dir: Path) -> None:
    previous = staging / ".previous"
    previous.mkdir()
    moved: list[tuple[Path, Path | None]] = []
    try:
        for name in names:
            target = out_dir / name
            if target.is_dir():
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(target))
            saved = previous / name if target.exists() else None
            if saved:
                os.replace(target, saved)
            moved.append((target, saved))
            os.replace(staging / name, target)
    except OSError:
        for target, saved in reversed(moved):
            if saved:
                os.replace(saved, target)
            else:
                target.unlink(missing_ok=True)
        raise


def render_specs(config: StackConfig, specs: list[JobSpec]) -> dict[Path, dict]:
    """``{manifest_path(spec): manifest}`` for specs of ``config``'s teams; two specs never share a file."""
    rendered: dict[Path, dict] = {}
    for spec in specs:
        path = manifest_path(spec)
        if path in rendered:
            raise ValueError(f"two jobs named {spec.name!r} would both be written to {path}")
        rendered[path] = render(spec, config.team(spec.team))
    return rendered


def render_all(config: StackConfig, out_dir: Path, header: str = "") -> list[Path]:
    """Render every kind for every team of ``config`` into ``out_dir``; returns the files written."""
    return write_manifests(render_specs(config, default_specs(config)), out_dir, header)
