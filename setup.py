"""Everything installs under ``gpuyard.`` (a user's own ``jobs/`` or ``sim.py`` cannot shadow it, nor be shadowed): the
folders infra/, jobs/ and sim/ are the packages gpuyard.infra, gpuyard.jobs and gpuyard.sim, those present (an
image's build context has no sim/). The rest of the metadata is pyproject.toml's."""

from setuptools import find_packages, setup

FOLDERS = ("infra", "jobs", "sim")

setup(
    package_dir={f"gpuyard.{folder}": folder for folder in FOLDERS},
    packages=[f"gpuyard.{name}" for name in find_packages(include=[f"{folder}*" for folder in FOLDERS])],
)
