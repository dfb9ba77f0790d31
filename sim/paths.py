"""Where `gpuyard sim` keeps what it builds and runs: outside the checkout, under $GPUYARD_CACHE or ~/.cache/gpuyard."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from gpuyard.infra.stack_file import check_stack_name

if TYPE_CHECKING:
    from gpuyard.sim.versions import Component

CACHE_ENV = "GPUYARD_CACHE"
# Written by `gpuyard sim up` into every folder it makes for a cluster (its state folder, the folders upstream
# hard-codes elsewhere), naming the state folder; `down` removes a folder only when it holds this file.
OWNER_FILE = ".gpuyard-sim"
BUILD_RECORD = "build.json"  # written last by a component's build (sim/build.py)


def cache_root() -> Path:
    env = os.environ.get(CACHE_ENV)
    return (Path(env) if env else Path.home() / ".cache" / "gpuyard") / "sim"


def bin_dir(component: str, version: str) -> Path:
    return cache_root() / "bin" / f"{component}-{version}"


def built(component: Component) -> Path | None:
    """The cache folder of ``component`` if a build of its present recipe finished there (a patch or a go.sum
    changed since: None)."""
    directory = bin_dir(component.name, component.version)
    record = directory / BUILD_RECORD
    complete = (record.is_file() and json.loads(record.read_text()).get("recipe") == component.recipe
                and all((directory / name).is_file() for name in component.binaries))
    return directory if complete else None


def state_root() -> Path:
    return cache_root() / "state"


def state_dir(stack: str) -> Path:
    """The state folder of ``stack``'s simulated cluster; a StackFileError unless ``stack`` is a stack name, so
    no name (``..``, ``/x``, ``''``) can point it anywhere else."""
    return state_root() / check_stack_name(stack)


def claim(folder: Path, state: Path) -> None:
    """Make ``folder`` (FileExistsError if it is there: then it is not ours) and mark it as ``state``'s."""
    folder.mkdir(parents=True)
    (folder / OWNER_FILE).write_text(f"{state}\n")


def claimed_by(folder: Path, state: Path) -> bool:
    """Whether ``folder`` is a real folder ``claim`` made for ``state``."""
    marker = folder / OWNER_FILE
    try:
        return (not folder.is_symlink() and folder.is_dir() and not marker.is_symlink()
                and marker.read_text() == f"{state}\n")
    except (OSError, UnicodeDecodeError):
        return False
