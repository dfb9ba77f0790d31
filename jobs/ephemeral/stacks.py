"""Ephemeral stacks through the Pulumi Automation API: create with a lease, list, destroy, reap.

An environment is a stack of this project whose config is ``stacks/Pulumi.ephemeral.yaml``
with its own cluster name (``<template cluster>-<NAME>``) and a ``gpuyard:lease``
(owner, team, ``expires_at`` in ISO-8601 UTC). Only stacks with a lease are listed,
destroyed or reaped, so ``dev`` and ``prod`` are never touched. Every command checks
for the Pulumi CLI before it changes anything.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from pulumi import automation as auto
from pydantic import ValidationError

from gpuyard.infra.config import (MAX_BUCKET_NAME, RULES, Lease, default_checkpoint_bucket, load_stack, parse_stack,
                          stack_file)
from gpuyard.infra.conventions import LABEL_NODEPOOL
from gpuyard.infra.stack_file import STACK_NAME_RULE, StackFileError, check_stack_name, read_config
from gpuyard.infra.validation import validation_message
from gpuyard.jobs.ephemeral.cleanup import Cleaner, CleanupError, Report
from gpuyard.jobs.ephemeral.ttl import format_expiry

PROJECT_DIR = Path(__file__).resolve().parents[2]  # holds Pulumi.yaml
TEMPLATE_STACK = "ephemeral"
LEASE_KEY = "gpuyard:lease"
PULUMI_MISSING = ("the Pulumi CLI is not installed (no `pulumi` on PATH): install it with "
                  "`curl -fsSL https://get.pulumi.com | sh` and open a new shell, "
                  "see https://www.pulumi.com/docs/iac/download-install/")
Output = Callable[[str], None]
# How long a drain may take: the GPU pools' terminationGracePeriod (1h, infra/karpenter.py) bounds how long Karpenter
# waits for a node's pods, then the instance terminates.
DRAIN_TIMEOUT_SECONDS = 75 * 60
DRAIN_POLL_SECONDS = 5


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


MAX_CLUSTER_NAME = 63  # StackConfig.cluster_name is a DNS label


def check_name(name: str) -> None:
    """An environment's name is a stack name (the one validator every command uses)."""
    try:
        check_stack_name(name)
    except StackFileError:
        raise EnvError(f"bad environment name {name!r}: {STACK_NAME_RULE} (like pr-123)") from None


def check_lease(owner: str, team: str | None, expires_at: datetime) -> None:
    """The lease's fields as the flags that set them: ``--owner``, ``--team``."""
    try:
        Lease.model_validate({"owner": owner, "team": team, "expires_at": expires_at})
    except ValidationError as error:
        raise EnvError(validation_message(error, where=lambda loc: f"--{loc[0]}" if loc else "", rules=RULES)) from None


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
    return read_config(stack_file(TEMPLATE_STACK))


def _workspace() -> auto.LocalWorkspace:
    require_pulumi_cli()
    return auto.LocalWorkspace(work_dir=str(PROJECT_DIR))


def _config_value(value: Any) -> auto.ConfigValue:
    return auto.ConfigValue(value=value if isinstance(value, str) else json.dumps(value))


def new_env_config(name: str, ttl: timedelta, owner: str, team: str | None, now: datetime) -> dict[str, Any]:
    """Everything ``create_env`` checks before it changes anything; the config it would set."""
    check_name(name)
    check_lease(owner, team, now + ttl)
    if stack_file(name).exists():
        raise EnvError(f"stack {name!r} already exists ({stack_file(name)})")
    template = _template()
    cluster = f"{template['gpuyard:cluster_name']}-{name}"
    derived = [("cluster", cluster, MAX_CLUSTER_NAME)]
    if "gpuyard:checkpoint_bucket" not in template:
        derived.append(("checkpoint bucket", default_checkpoint_bucket(cluster), MAX_BUCKET_NAME))
    for what, value, limit in derived:
        if len(value) > limit:
            raise EnvError(f"NAME {name!r} is too long: its {what} {value} would have {len(value)} characters, at "
                           f"most {limit} (NAME at most {limit - len(value) + len(name)})")
    return env_config(name, template, owner, team, now + ttl)


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
    """Leftovers could not all be deleted; the stack was destroyed but kept, so a rerun finishes the cleanup."""

    def __init__(self, cluster: str, report: Report):
        super().__init__(f"cleanup of cluster {cluster} is incomplete; stack kept, rerun to finish")
        self.cluster = cluster
        self.report = report


class TeardownStopped(RuntimeError):
    """The teardown stopped before deleting anything (the API probe or the NodePool drain failed), as one line."""


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


def destroy_env(name: str, out: Output, drain_timeout: float = DRAIN_TIMEOUT_SECONDS) -> None:
    """Drain Karpenter's NodePools, ``pulumi destroy``, delete the cluster's leftovers, ``stack rm``.

    Destroy first, clean after: while the cluster lives its controllers own what they made (Karpenter relaunches
    nodes that are terminated under it), so cleanup runs only once the cluster is gone (``Cleaner.refusal``). A live
    cluster is drained first; when its API does not answer or the drain fails, nothing is deleted
    (TeardownStopped). When ``pulumi destroy`` stops with the cluster gone (leftovers hold the VPC: security groups,
    ENIs), the leftovers are deleted and the destroy runs again."""
    stack, env = leased_env(name)
    cleaner = Cleaner(env.cluster_name, env.region or None, on_progress=out)
    out(f"[1/4] {name}: draining Karpenter's NodePools in cluster {env.cluster_name}")
    if cleaner.cluster_status() is None:
        out(f"cluster {env.cluster_name} does not exist: nothing to drain")
    else:
        drain_node_pools(_kubeconfig(stack, env.cluster_name), env.cluster_name, out, drain_timeout)
    out(f"[2/4] {name}: pulumi destroy")
    try:
        stack.destroy(on_output=out)
    except auto.CommandError:
        if cleaner.cluster_status() is not None:
            raise
        out(f"pulumi destroy stopped with cluster {env.cluster_name} gone: deleting its leftovers, then again")
        _clean_up(cleaner, env.cluster_name)
        stack.destroy(on_output=out)
    out(f"[3/4] {name}: deleting what Kubernetes and Karpenter left for cluster {env.cluster_name}")
    _clean_up(cleaner, env.cluster_name)
    out(f"[4/4] {name}: pulumi stack rm")
    stack.workspace.remove_stack(name)


def _clean_up(cleaner: Cleaner, cluster: str) -> None:
    """Delete the leftovers of a cluster that no longer exists (CleanupError otherwise); CleanupIncomplete when some
    are left."""
    refusal = cleaner.refusal(ephemeral_cluster_prefix())
    if refusal:
        raise CleanupError(f"refusing to clean up: {refusal}")
    plan = cleaner.find()
    if plan:
        report = cleaner.run(plan)
        if not report.ok:
            raise CleanupIncomplete(cluster, report)


def _kubectl(command: list[str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*command, *args], capture_output=True, text=True)


def _last_line(result: subprocess.CompletedProcess) -> str:
    return (result.stderr.strip().splitlines() or ["no answer"])[-1][:200]


def _kubeconfig(stack: auto.Stack, cluster: str) -> str:
    """The stack's ``kubeconfig`` output; TeardownStopped without one."""
    kubeconfig = stack.outputs().get("kubeconfig")
    if kubeconfig is None:
        raise TeardownStopped(f"cluster {cluster} exists but stack {stack.name} has no kubeconfig output to drain it "
                              "with: nothing deleted")
    return kubeconfig.value if isinstance(kubeconfig.value, str) else json.dumps(kubeconfig.value)


def drain_node_pools(kubeconfig: str, cluster: str, out: Output, timeout: float) -> None:
    """Delete Karpenter's NodePools with a foreground cascade and wait until their NodeClaims and nodes are gone.

    NodePools have no finalizer of their own; their NodeClaims name them as owner with blockOwnerDeletion
    (kubernetes-sigs/karpenter v1.14.1, pkg/controllers/provisioning/scheduling/nodeclaimtemplate.go), so with
    ``--cascade=foreground`` a NodePool is gone only after its NodeClaims are, and each NodeClaim only after
    Karpenter drained its node and terminated the instance. TeardownStopped when the API does not answer or the
    drain does not finish within ``timeout`` seconds."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise TeardownStopped(f"cluster {cluster} exists and kubectl is not on PATH to drain its NodePools: "
                              "nothing deleted (install kubectl and rerun)")
    with tempfile.NamedTemporaryFile("w", suffix=".kubeconfig") as file:
        file.write(kubeconfig)
        file.flush()
        command = [kubectl, "--kubeconfig", file.name, "--request-timeout=20s"]
        probe = _kubectl(command, "get", "nodepools.karpenter.sh", "-o", "name")
        if probe.returncode != 0:
            raise TeardownStopped(f"the API of cluster {cluster} does not answer ({_last_line(probe)}): nothing "
                                  "deleted; rerun once it answers")
        deadline = time.monotonic() + timeout
        drained = _kubectl(command, "delete", "nodepools.karpenter.sh", "--all", "--cascade=foreground",
                           "--wait=true", f"--timeout={int(timeout)}s")
        if drained.returncode != 0:
            raise TeardownStopped(f"draining the NodePools of cluster {cluster} failed ({_last_line(drained)}): "
                                  "nothing else deleted; rerun to go on")
        while left := _karpenter_nodes(command):
            if time.monotonic() > deadline:
                raise TeardownStopped(f"{len(left)} of Karpenter's NodeClaims and nodes still in cluster {cluster} "
                                      f"after {int(timeout)}s ({', '.join(left[:3])}): nothing else deleted; rerun")
            time.sleep(DRAIN_POLL_SECONDS)
    out(f"NodePools drained: no NodeClaim or Karpenter node left in cluster {cluster}")


def _karpenter_nodes(command: list[str]) -> list[str]:
    """The NodeClaims and the nodes Karpenter launched that still exist."""
    listed = _kubectl(command, "get", "nodeclaims.karpenter.sh,nodes", "-l", LABEL_NODEPOOL, "-o", "name")
    if listed.returncode != 0:
        raise TeardownStopped(f"listing NodeClaims and nodes failed ({_last_line(listed)}): nothing else deleted")
    return listed.stdout.split()
