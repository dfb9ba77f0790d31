"""Build each component's binaries from its Go module into the cache, skipping what is already built.

Only Go modules are ever downloaded (by the Go toolchain, from the module proxy). A component's directory appears
once all its binaries are linked, with ``build.json`` recording how long its build took.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from gpuyard.sim.paths import BUILD_RECORD, bin_dir, built
from gpuyard.sim.versions import Component, components, tools

class BuildError(RuntimeError):
    """A `go build` that failed; the message ends with its last lines of output."""


def go_available() -> bool:
    return shutil.which("go") is not None


def _go_env() -> dict[str, str]:
    # the go.mod and go.sum of each module are committed: nothing may rewrite them or fetch another toolchain
    return {**os.environ, "GOFLAGS": "-mod=readonly -buildvcs=false", "GOTOOLCHAIN": "local"}


def write_workspace(component: Component, folder: Path) -> Path | None:
    """A go.work (in ``folder``) using our module and patched copies of the upstream modules ``component.patches``
    change (Go refuses overlays of files in its module cache); None without patches."""
    if not component.patches:
        return None
    from gpuyard.sim.upstream import module_dir

    copies: dict[str, Path] = {}
    for patch in component.patches:
        copy = copies.get(patch.module)
        if copy is None:
            copy = copies[patch.module] = folder / "src" / patch.module
            shutil.copytree(module_dir(component.name, patch.module), copy, copy_function=shutil.copyfile)
            for directory, _, _ in os.walk(copy):
                os.chmod(directory, 0o755)  # the module cache's folders are read-only
        source = copy / patch.path
        text = source.read_text()
        if patch.old not in text:
            raise BuildError(f"patch for {patch.module}/{patch.path}: {patch.old!r} not found")
        source.write_text(text.replace(patch.old, patch.new))
    go = next(line for line in (component.module_dir / "go.mod").read_text().splitlines() if line.startswith("go "))
    uses = "".join(f"\t{path}\n" for path in (component.module_dir, *copies.values()))
    workspace = folder / "go.work"
    workspace.write_text(f"{go}\n\nuse (\n{uses})\n")
    return workspace


def build_component(component: Component, say: Callable[[str], None]) -> Path:
    """Link every binary of ``component`` (one `go build` each, sharing Go's build cache) into its cache folder."""
    done = built(component)
    if done:
        return done
    target = bin_dir(component.name, component.version)
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    started = time.monotonic()
    seconds: dict[str, float] = {}
    workspace = write_workspace(component, staging)
    env = {**_go_env(), "GOWORK": str(workspace)} if workspace else _go_env()
    for name, package in component.binaries.items():
        say(f"building {component.name} {component.version}: {name}")
        began = time.monotonic()
        tags = ["-tags", ",".join(component.tags)] if component.tags else []
        command = ["go", "build", "-trimpath", *tags, "-ldflags", " ".join(("-s", "-w", *component.ldflags)),
                   "-o", str(staging / name), package]
        result = subprocess.run(command, cwd=component.module_dir, env=env, capture_output=True, text=True)
        if result.returncode != 0:
            tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
            raise BuildError(f"go build {package} (in {component.module_dir}) failed:\n{tail}")
        seconds[name] = round(time.monotonic() - began, 1)
        say(f"built {name} in {seconds[name]:.0f}s")
    record = {"component": component.name, "version": component.version, "recipe": component.recipe,
              "seconds": round(time.monotonic() - started, 1), "binaries": seconds}
    (staging / BUILD_RECORD).write_text(json.dumps(record, indent=1) + "\n")
    shutil.rmtree(staging / "src", ignore_errors=True)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def build_all(kubernetes_minor: str, say: Callable[[str], None] = print, only: tuple[str, ...] = ()) -> dict[str, Path]:
    """Build (or find) every component; returns each component's binary folder by name."""
    return {
        component.name: build_component(component, say)
        for component in components(kubernetes_minor)
        if not only or component.name in only
    }


if __name__ == "__main__":  # python -m gpuyard.sim.build [STACK [COMPONENT...]]: what CI runs before the tests
    from gpuyard.infra.config import load_stack

    only = tuple(sys.argv[2:])
    build_all(load_stack(sys.argv[1] if len(sys.argv) > 1 else "dev").cluster.kubernetes_version, only=only)
    for tool in tools():
        if not only or tool.name in only:
            build_component(tool, print)
    if not only or "realnode" in only:  # what real nodes need besides the cluster (`gpuyard sim up --real-nodes`)
        from gpuyard.sim import pause
        from gpuyard.sim.versions import node_components

        stack_config = load_stack(sys.argv[1] if len(sys.argv) > 1 else "dev")
        for component in node_components(stack_config.cluster.kubernetes_version):
            build_component(component, print)
        print(f"pause image layer from {pause.fetch().name}")
