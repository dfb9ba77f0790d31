"""Where `gpuyard sim` keeps what it builds and runs: outside the checkout, under $GPUYARD_CACHE or ~/.cache/gpuyard."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "GPUYARD_CACHE"


def cache_root() -> Path:
    env = os.environ.get(CACHE_ENV)
    return (Path(env) if env else Path.home() / ".cache" / "gpuyard") / "sim"


def bin_dir(component: str, version: str) -> Path:
    return cache_root() / "bin" / f"{component}-{version}"


def state_dir(stack: str) -> Path:
    return cache_root() / "state" / stack
