"""Typed stack configuration: the one reading of ``stacks/Pulumi.<stack>.yaml``.

Both the Pulumi program (``load_config(pulumi.Config())``) and the job renderers
(``load_stack(name)``) go through :class:`StackConfig`, so the team list has one
source of truth. Components and renderers never read raw config themselves.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

PROJECT = "gpuyard"
DNS1123_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
STACKS_DIR_ENV = "GPUYARD_STACKS_DIR"

Label = Annotated[str, Field(pattern=DNS1123_LABEL, max_length=63)]


class ConfigError(ValueError):
    """A stack configuration problem, phrased as one line for the user."""


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Team(Frozen):
    """A tenant: its namespace, Volcano queue, quota, identity and checkpoint prefix."""

    name: Annotated[str, Field(pattern=DNS1123_LABEL, max_length=30)]
    namespace: Label | None = None
    queue: Label | None = None
    queue_weight: Annotated[int, Field(ge=1, le=1000)] = 1
    gpu_quota: Annotated[int, Field(ge=0)] = 8
    cpu_quota: Annotated[int, Field(ge=1)] = 64
    memory_quota_gib: Annotated[int, Field(ge=1)] = 256
    image: str | None = None
    service_account: Label | None = None
    checkpoint_prefix: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9/_.-]*$")] | None = None
    priority_class: Label = "gpuyard-normal"

    @model_validator(mode="after")
    def _fill_defaults(self) -> "Team":
        defaults = {
            "namespace": f"team-{self.name}",
            "queue": self.name,
            "service_account": f"{self.name}-trainer",
            "checkpoint_prefix": f"teams/{self.name}",
        }
        for field, value in defaults.items():
            if getattr(self, field) is None:
                object.__setattr__(self, field, value)
        object.__setattr__(self, "checkpoint_prefix", self.checkpoint_prefix.strip("/"))
        return self


class StackConfig(Frozen):
    """Everything a stack configures; ``teams`` is the tenant list."""

    stack: Label
    region: str = "us-west-2"
    cluster_name: Label
    image_registry: str | None = None
    image_tag: Annotated[str, Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")] = "0.1.0"
    teams: tuple[Team, ...] = ()

    @model_validator(mode="after")
    def _unique_teams(self) -> "StackConfig":
        for field in ("name", "namespace", "queue", "checkpoint_prefix"):
            seen: set[str] = set()
            for team in self.teams:
                value = getattr(team, field)
                if value in seen:
                    raise ValueError(f"duplicate team {field} {value!r}")
                seen.add(value)
        return self

    def team(self, name: str) -> Team:
        for team in self.teams:
            if team.name == name:
                return team
        known = ", ".join(t.name for t in self.teams) or "none"
        raise ConfigError(f"unknown team {name!r} in stack {self.stack!r} (teams: {known})")


def _one_line(error: ValidationError, where: str) -> str:
    first = error.errors()[0]
    location = ".".join(str(part) for part in first["loc"]) or "config"
    return f"{where}: {location}: {first['msg']}"


def parse_stack(stack: str, values: dict[str, Any]) -> StackConfig:
    """Build a StackConfig from the ``gpuyard:`` and ``aws:`` keys of a stack's config."""
    ours = {k.split(":", 1)[1]: v for k, v in values.items() if k.startswith(f"{PROJECT}:")}
    if "aws:region" in values:
        ours.setdefault("region", values["aws:region"])
    ours.setdefault("stack", stack)
    try:
        return StackConfig.model_validate(ours)
    except ValidationError as error:
        raise ConfigError(_one_line(error, f"stack {stack!r}")) from None


def stacks_dir() -> Path:
    """Where the stack files live: $GPUYARD_STACKS_DIR, else ``stacks/`` of this checkout."""
    env = os.environ.get(STACKS_DIR_ENV)
    return Path(env) if env else Path(__file__).resolve().parent.parent / "stacks"


def stack_file(stack: str, directory: Path | None = None) -> Path:
    return (directory or stacks_dir()) / f"Pulumi.{stack}.yaml"


def load_stack(stack: str, directory: Path | None = None) -> StackConfig:
    """Read and validate ``Pulumi.<stack>.yaml``; a ConfigError names what is wrong."""
    path = stack_file(stack, directory)
    if not path.is_file():
        available = sorted(p.name[len("Pulumi."):-len(".yaml")] for p in path.parent.glob("Pulumi.*.yaml"))
        raise ConfigError(f"unknown stack {stack!r}: no {path} (stacks: {', '.join(available) or 'none'})")
    try:
        document = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML ({str(error).splitlines()[0]})") from None
    return parse_stack(stack, document.get("config") or {})
