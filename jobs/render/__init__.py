"""Render JobSpecs into operator manifests: one small module per kind, one pod builder.

``render(spec, team)`` returns the manifest as a dict, ``to_yaml`` its bytes-stable text,
``render_all(config, out_dir)`` writes every kind the stack runs for every team (default sizes)
and ``write_manifests`` puts files in place only once all of them rendered.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import yaml

from infra.config import StackConfig, Team
from jobs.render import mpijob, pytorchjob, rayjob, trainjob, volcanojob
from jobs.placement import place, stack_pools
from jobs.spec import JobSpec, Kind, build_spec, stack_kinds

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
    """Where a job's manifest goes inside an output folder: ``<team>/<name>.yaml``."""
    return Path(spec.team) / f"{spec.name}.yaml"


def default_specs(config: StackConfig) -> list[JobSpec]:
    """One job of each kind the stack runs, per team, at the default size, placed on the stack."""
    pools = stack_pools(config)
    return [place(config, build_spec(config, team, kind), pools) for team in config.teams for kind in stack_kinds(config)]


def write_manifests(rendered: dict[Path, dict], out_dir: Path) -> list[Path]:
    """Write ``{relative path: manifest}`` under ``out_dir`` all at once.

    Files are written to a temporary folder next to ``out_dir`` and moved into place
    only after every one was written, so a failure leaves ``out_dir`` as it was.
    """
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir.parent, prefix=f".{out_dir.name}.") as staging:
        for relative, manifest in rendered.items():
            path = Path(staging) / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(to_yaml(manifest))
        written = []
        for relative in rendered:
            target = out_dir / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(Path(staging) / relative, target)
            written.append(target)
    return written


def render_specs(config: StackConfig, specs: list[JobSpec]) -> dict[Path, dict]:
    """``{manifest_path(spec): manifest}`` for specs of ``config``'s teams."""
    return {manifest_path(spec): render(spec, config.team(spec.team)) for spec in specs}


def render_all(config: StackConfig, out_dir: Path) -> list[Path]:
    """Render every kind for every team of ``config`` into ``out_dir``; returns the files written."""
    return write_manifests(render_specs(config, default_specs(config)), out_dir)
