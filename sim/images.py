"""The job images for the simulated cluster: ``images/*/Dockerfile`` built by BuildKit (sim/buildkit.py) on bases
made here (sim/bases/Dockerfile: Debian from debootstrap, the pinned torch and Ray from PyPI), pushed to the sim's
registry (sim/registry.py).

Each image and base is tagged ``in-<digest>`` of its inputs (Dockerfile, build context files, build arguments, the
base's inputs); one already in the registry is not built again, and the stack's tag is pointed at it. Layers are
pushed uncompressed: the registry is local, and gzip of the 4 GB torch layer would cost minutes on every change.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import shutil
import subprocess
import tomllib
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Callable

from gpuyard.infra.config import load_stack
from gpuyard.infra.conventions import IMAGE_NAMES
from gpuyard.sim import buildkit
from gpuyard.sim.build import build_component
from gpuyard.sim.paths import cache_root
from gpuyard.sim.registry import Registry
from gpuyard.sim.versions import IMAGE_COMPONENTS

REPO = Path(__file__).resolve().parent.parent
BASES_DOCKERFILE = Path(__file__).resolve().parent / "bases" / "Dockerfile"
BASES_REPOSITORY = "gpuyard-sim"  # <registry>/gpuyard-sim/<stage>: the bases every stack's images share
DEBIAN = {"suite": "bookworm", "variant": "minbase", "mirror": "http://deb.debian.org/debian"}
# image -> the stage of sim/bases/Dockerfile that stands in for its public base
IMAGE_BASE = {"ddp": "torch", "mpi": "torch", "ray": "ray"}
# The EFA installer and aws-ofi-nccl are downloaded from AWS and GitHub at build time: not reachable here.
SIM_BUILD_ARGS = {"EFA": "skip"}
PUSH = "push=true,registry.insecure=true,compression=uncompressed,force-compression=true,oci-mediatypes=true"

Say = Callable[[str], None]


@dataclass(frozen=True)
class Build:
    """One thing to build: ``dockerfile`` (stage ``target``) with ``build_args``, pushed as ``repository:tag``."""

    repository: str
    dockerfile: Path
    context: Path
    build_args: dict[str, str]
    inputs: str  # digest of everything the build reads
    target: str | None = None

    @property
    def tag(self) -> str:
        return f"in-{self.inputs[:20]}"


def build_images(registry: Registry, stack: str, say: Say = print) -> dict[str, str]:
    """Build (or find) the three images for ``stack`` in ``registry``; returns each image's reference there."""
    config = load_stack(stack)
    bases = {stage: base_build(stage) for stage in ("torch", "ray")}
    images = {image: image_build(config.cluster_name, image, bases[IMAGE_BASE[image]])
              for image in IMAGE_NAMES}
    missing = [b for b in (*bases.values(), *images.values()) if registry.manifest(b.repository, b.tag) is None]
    if missing:
        bins = {c.name: build_component(c, say) for c in IMAGE_COMPONENTS if c.name != "registry"}
        with buildkit.running(bins, [registry.address], say, hub_mirror=registry.address) as builder:
            for build in missing:
                _build_and_push(builder, registry, build, say)
    for image, build in images.items():
        registry.tag(build.repository, build.tag, config.image_tag)
        say(f"image {image}: {registry.address}/{build.repository}:{config.image_tag} ({build.tag})")
    return {image: f"{registry.address}/{build.repository}:{config.image_tag}" for image, build in images.items()}


def base_build(stage: str) -> Build:
    args = {**pins(), "DEBIAN": " ".join(f"{k}={v}" for k, v in sorted(DEBIAN.items()))}
    inputs = digest(BASES_DOCKERFILE.read_bytes(), stage, args, _builder_version())
    return Build(f"{BASES_REPOSITORY}/{stage}", BASES_DOCKERFILE, debian_context(), args, inputs, target=stage)


def image_build(cluster: str, image: str, base: Build) -> Build:
    dockerfile = REPO / "images" / image / "Dockerfile"
    # by name only, which the registry answers as BuildKit's Docker Hub mirror: the images (their base label and
    # BuildKit's cache keys) do not depend on where the registry listens
    args = {**SIM_BUILD_ARGS, "BASE_IMAGE": f"{base.repository}:{base.tag}", "GPUYARD_VERSION": version("gpuyard")}
    files = [(str(path.relative_to(REPO)), path.stat().st_mode & 0o111, path.read_bytes()) for path in context_files()]
    inputs = digest(dockerfile.read_bytes(), args, base.inputs, files, _builder_version())
    return Build(f"{cluster}/{image}", dockerfile, REPO, args, inputs)


def pins() -> dict[str, str]:
    """The versions the bases install: pyproject.toml's torch, the numpy and Ray the tests run."""
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    torch = next(d.split("==", 1)[1] for d in dependencies if d.startswith("torch=="))
    return {"TORCH_VERSION": torch, "NUMPY_VERSION": version("numpy"), "RAY_VERSION": version("ray")}


def context_files(root: Path = REPO) -> list[Path]:
    """The files of the build context that .dockerignore lets in (its form: ``*``, then ``!dir/`` or ``!file``
    includes, then exclude patterns; tests/test_images_dockerfiles.py pins it)."""
    lines = [line.strip() for line in (root / ".dockerignore").read_text().splitlines()]
    patterns = [line for line in lines if line and not line.startswith("#")]
    included = [p[1:].rstrip("/") for p in patterns if p.startswith("!")]
    excluded = [p.removeprefix("**/") for p in patterns[1:] if not p.startswith("!")]
    files = []
    for name in included:
        path = root / name
        candidates = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        files += [p for p in candidates
                  if not any(fnmatch.fnmatch(part, pattern) for part in p.relative_to(root).parts for pattern in excluded)]
    return files


def digest(*parts) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def _builder_version() -> str:
    return next(f"buildkit {c.version}" for c in IMAGE_COMPONENTS if c.name == "buildkit")


def debian_context() -> Path:
    """The folder that holds (or will hold, make_debian) ``debian.tar``, one per ``DEBIAN`` in the cache."""
    return cache_root() / "images" / f"debian-{digest(DEBIAN)[:16]}"


def make_debian(folder: Path, say: Say) -> None:
    """debootstrap ``DEBIAN`` into a tar in ``folder`` (minutes, as root); package caches left out."""
    if (folder / "debian.tar").is_file():
        return
    if shutil.which("debootstrap") is None:
        raise buildkit.BuildFailed("making the Debian base needs debootstrap (apt-get install debootstrap)")
    staging = folder.with_name(folder.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    rootfs = staging / "rootfs"
    rootfs.mkdir(parents=True)
    say(f"debootstrap {DEBIAN['suite']} ({DEBIAN['variant']}) from {DEBIAN['mirror']}")
    result = subprocess.run(["debootstrap", f"--variant={DEBIAN['variant']}", DEBIAN["suite"], str(rootfs),
                             DEBIAN["mirror"]], capture_output=True, text=True)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
        raise buildkit.BuildFailed(f"debootstrap failed:\n{tail}")
    for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for path in (rootfs / leftover).glob("*"):
            if path.is_file():
                path.unlink()
    tar = subprocess.run(["tar", "--numeric-owner", "--xattrs", "-C", str(rootfs), "-cf", str(staging / "debian.tar"),
                          "--exclude=./dev/*", "--exclude=./proc/*", "--exclude=./sys/*", "."],
                         capture_output=True, text=True)
    if tar.returncode != 0:
        raise buildkit.BuildFailed(f"tar of the Debian root failed: {tar.stderr.strip()}")
    shutil.rmtree(rootfs)
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)


def pip_cache() -> Path:
    """This machine's pip cache (pip's default place): the bases' pip reads it; what it adds stays in the build.
    CI's `pip install` of the test environment fills it with the same torch wheels."""
    path = Path(os.environ.get("PIP_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pip")
    path.mkdir(parents=True, exist_ok=True)
    return path


def local_certificate_authorities() -> Path:
    """This machine's own CAs, where Debian keeps them (an empty folder of the cache where it has none)."""
    local = Path("/usr/local/share/ca-certificates")
    if local.is_dir():
        return local
    empty = cache_root() / "images" / "no-local-ca"
    empty.mkdir(parents=True, exist_ok=True)
    return empty


def _build_and_push(builder: buildkit.Builder, registry: Registry, build: Build, say: Say) -> None:
    name = build.repository.replace("/", "-")
    named = {}
    if build.dockerfile == BASES_DOCKERFILE:
        make_debian(build.context, say)
        named.update({"pip-cache": pip_cache(), "local-ca": local_certificate_authorities()})
    say(f"building {build.repository} ({build.tag})")
    output = f'type=image,"name={registry.address}/{build.repository}:{build.tag}",{PUSH}'
    builder.build(name, build.dockerfile, build.context, output=output, target=build.target,
                  build_args=build.build_args, named_contexts=named)


def build_with_own_registry(stack: str, say: Say = print) -> dict[str, str]:
    """build_images into the cache's registry storage, served on 127.0.0.1 only while building."""
    from gpuyard.sim.registry import serving

    binary = build_component(next(c for c in IMAGE_COMPONENTS if c.name == "registry"), say) / "registry"
    with serving(cache_root() / "images" / "registry-run", binary) as registry:
        return build_images(registry, stack, say)


if __name__ == "__main__":  # python -m gpuyard.sim.images [STACK]: what CI runs before the tests
    import sys

    build_with_own_registry(sys.argv[1] if len(sys.argv) > 1 else "dev")
