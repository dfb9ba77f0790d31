"""Ephemeral stacks through the Pulumi Automation API: create with a lease, list, destroy, reap.

An environment is a stack of this project whose config is ``stacks/Pulumi.ephemeral.yaml``
with its own cluster name (``<template cluster>-<NAME>``) and a ``gpuyard:lease``
(owner, team, ``expires_at`` in ISO-8601 UTC). Only stacks with a lease are listed,
destroyed or reaped, so ``dev`` and ``prod`` are never touched. Every command checks
for the Pulumi CLI before it changes anything.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from pulumi import automation as auto
from pydantic import ValidationError

from infra.config import DNS1123_LABEL, Lease, load_stack, parse_stack, stack_file
from jobs.ephemeral.cleanup import Cleaner, Report
from jobs.ephemeral.ttl import format_expiry

PROJECT_DIR = Path(__file__).resolve().parents[2]  # holds Pulumi.yaml
TEMPLATE_STACK = "ephemeral"
LEASE_KEY = "gpuyard:lease"
PULUMI_MISSING = ("the Pulumi CLI is not installed (no `pulumi` on PATH): install it with "
                  "`curl -fsSL https://get.pulumi.com | sh` and open a new shell, "
                  "see https://www.pulumi.com/docs/iac/download-install/")
Output = Callable[[str], None]


class EnvError(ValueError):
    """Bad input or a missing tool, phrased as one line; nothing was changed."""


@dataclass(frozen=True)
class EnvStack:
    """An ephemeral stack as ``list`` shows it."""

    name: str
    cluster_name: str
    region: str
    lease: Lease | None


def require_pulumi_cli() -> None:
    if shutil.which("pulumi") is None:
        raise EnvError(PULUMI_MISSING)


def check_name(name: str) -> None:
    if not re.fullmatch(DNS1123_LABEL, name or ""):
        raise EnvError(f"bad environment name {name!r}: use lower-case letters, digits and '-' (like pr-123)")


def ephemeral_cluster_prefix() -> str:
    """What every environment's cluster name starts with: the template's cluster name and a dash."""
    return f"{load_stack(TEMPLATE_STACK).cluster_name}-"


def env_config(name: str, template: Mapping[str, Any], owner: str, team: str | None,
               expires_at: datetime) -> dict[str, Any]:
    """The stack config of environment ``name``: the template's, its own cluster, the lease; validated."""
    values = {**template, "gpuyard:cluster_name": f"{template['gpuyard:cluster_name']}-{name}",
              LEASE_KEY: {"owner": owner, **({"team": team} if team else {}), "expires_at": format_expiry(expires_at)}}
    if team:
        parse_stack(TEMPLATE_STACK, template).team(team)
    parse_stack(name, values)
    return values


def env_from_config(name: str, values: Mapping[str, str]) -> EnvStack:
    """Read an environment from the Automation API's config strings (objects arrive as JSON)."""
    raw = values.get(LEASE_KEY)
    try:
        lease = None if raw is None else Lease.model_validate(json.loads(raw) if isinstance(raw, str) else raw)
    except (ValueError, ValidationError):
        raise EnvError(f"stack {name!r}: {LEASE_KEY} is not a valid lease: {raw!r}") from None
    return EnvStack(name, values.get("gpuyard:cluster_name", ""), values.get("aws:region", ""), lease)


def due_for_reaping(stacks: Iterable[EnvStack], now: datetime) -> list[EnvStack]:
    """The leased stacks whose lease has run out at ``now``, longest expired first."""
    expired = [stack for stack in stacks if stack.lease is not None and stack.lease.expires_at <= now]
    return sorted(expired, key=lambda stack: stack.lease.expires_at)


def _template() -> dict[str, Any]:
    load_stack(TEMPLATE_STACK)  # validates; ConfigError names the problem
    return yaml.safe_load(stack_file(TEMPLATE_STACK).read_text())["config"]


def _workspace() -> auto.LocalWorkspace:
    require_pulumi_cli()
    return auto.LocalWorkspace(work_dir=str(PROJECT_DIR))


def _config_value(value: Any) -> auto.ConfigValue:
    return auto.ConfigValue(value=value if isinstance(value, str) else json.dumps(value))


def new_env_config(name: str, ttl: timedelta, owner: str, team: str | None, now: datetime) -> dict[str, Any]:
    """Everything ``create_env`` checks before it changes anything; the config it would set."""
    check_name(name)
    if stack_file(name).exists():
        raise EnvError(f"stack {name!r} already exists ({stack_file(name)})")
    return env_config(name, _template(), owner, team, now + ttl)


def create_env(name: str, ttl: timedelta, owner: str, team: str | None, now: datetime, out: Output) -> EnvStack:
    """Validate everything, then create the stack, set its config and ``up`` it."""
    values = new_env_config(name, ttl, owner, team, now)
    workspace = _workspace()
    try:
        stack = auto.Stack.create(name, workspace)
    except auto.StackAlreadyExistsError:
        raise EnvError(f"stack {name!r} already exists") from None
    try:
        stack.set_all_config({key: _config_value(value) for key, value in values.items()})
    except auto.CommandError:
        workspace.remove_stack(name)
        raise
    out(f"creating {name}: cluster {values['gpuyard:cluster_name']}, expires {values[LEASE_KEY]['expires_at']}")
    stack.up(on_output=out)
    config = parse_stack(name, values)
    return EnvStack(name, config.cluster_name, config.region, config.lease)


def list_envs() -> list[EnvStack]:
    """Every stack of the project that has a lease."""
    workspace = _workspace()
    envs = []
    for summary in workspace.list_stacks():
        values = {key: value.value for key, value in workspace.get_all_config(summary.name).items()}
        env = env_from_config(summary.name, values)
        if env.lease is not None:
            envs.append(env)
    return envs


class CleanupIncomplete(RuntimeError):
    """Leftovers could not all be deleted; the stack was not destroyed."""

    def __init__(self, cluster: str, report: Report):
        super().__init__(f"cleanup of cluster {cluster} is incomplete; stack not destroyed, rerun to finish")
        self.cluster = cluster
        self.report = report


def leased_env(name: str) -> tuple[auto.Stack, EnvStack]:
    """The stack of environment ``name`` and its lease; EnvError unless it exists and is leased."""
    check_name(name)
    workspace = _workspace()
    try:
        stack = auto.Stack.select(name, workspace)
    except auto.StackNotFoundError:
        raise EnvError(f"unknown stack {name!r} (see `gpuyard env list`)") from None
    env = env_from_config(name, {key: value.value for key, value in stack.get_all_config().items()})
    if env.lease is None:
        raise EnvError(f"stack {name!r} has no {LEASE_KEY}: not an ephemeral environment, refusing to destroy it")
    return stack, env


def destroy_env(name: str, out: Output) -> None:
    """Drain NodePools, delete the cluster's leftovers, ``pulumi destroy``, ``stack rm``."""
    stack, env = leased_env(name)
    workspace = stack.workspace
    out(f"[1/4] {name}: draining NodePools")
    drain_node_pools(stack, out)
    out(f"[2/4] {name}: deleting what Kubernetes and Karpenter left for cluster {env.cluster_name}")
    cleaner = Cleaner(env.cluster_name, env.region or None, on_progress=out)
    plan = cleaner.find()
    if plan:
        report = cleaner.run(plan)
        if not report.ok:
            raise CleanupIncomplete(env.cluster_name, report)
    out(f"[3/4] {name}: pulumi destroy")
    stack.destroy(on_output=out)
    out(f"[4/4] {name}: pulumi stack rm")
    workspace.remove_stack(name)


def drain_node_pools(stack: auto.Stack, out: Output) -> None:
    """Delete Karpenter's NodePools so it drains and terminates their nodes; skip when the cluster does not answer."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        out("NodePool drain skipped: kubectl is not on PATH (cleanup terminates Karpenter's instances instead)")
        return
    kubeconfig = stack.outputs().get("kubeconfig")
    if kubeconfig is None:
        out("NodePool drain skipped: the stack has no kubeconfig output")
        return
    with tempfile.NamedTemporaryFile("w", suffix=".kubeconfig") as file:
        file.write(kubeconfig.value if isinstance(kubeconfig.value, str) else json.dumps(kubeconfig.value))
        file.flush()
        command = [kubectl, "--kubeconfig", file.name, "--request-timeout=20s"]
        probe = subprocess.run([*command, "get", "nodepools.karpenter.sh", "-o", "name"], capture_output=True, text=True)
        if probe.returncode != 0:
            reason = (probe.stderr.strip().splitlines() or ["no answer"])[-1][:200]
            out(f"NodePool drain skipped: the cluster does not answer ({reason})")
            return
        drained = subprocess.run([*command, "delete", "nodepools.karpenter.sh", "--all", "--wait=true", "--timeout=15m"],
                                 capture_output=True, text=True)
        out("NodePools drained" if drained.returncode == 0 else
            f"NodePool drain incomplete ({drained.stderr.strip()[:200]}); cleanup terminates what is left")
