"""Files of the upstream Go modules (CRDs, rendered charts, kwok stages), read where the Go toolchain unpacked them:
the module cache, at the version our module for that component requires. Nothing is copied into the checkout."""

from __future__ import annotations

import functools
import json
import subprocess
from pathlib import Path
from typing import Any, Iterator

import yaml

from gpuyard.sim.versions import GO_DIR


@functools.cache
def module_dir(component: str, module: str) -> Path:
    """The unpacked source of ``module`` at the version sim/go/<component>/go.mod requires."""
    result = subprocess.run(["go", "mod", "download", "-json", module], cwd=GO_DIR / component,
                            capture_output=True, text=True)
    info = json.loads(result.stdout or "{}")
    if result.returncode != 0 or "Dir" not in info:
        raise RuntimeError(f"go mod download {module} (in sim/go/{component}) failed: {info.get('Error', result.stderr)}")
    return Path(info["Dir"])


def documents(path: Path) -> Iterator[dict[str, Any]]:
    """The non-empty YAML documents of ``path``."""
    with path.open() as handle:
        yield from (document for document in yaml.load_all(handle, Loader=yaml.CSafeLoader) if document)


def documents_in(directory: Path, pattern: str = "*.yaml") -> Iterator[dict[str, Any]]:
    for path in sorted(directory.glob(pattern)):
        yield from documents(path)
