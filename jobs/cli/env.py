"""``gpuyard env``: ephemeral environments with a TTL, complete teardown, reaping."""

from __future__ import annotations

import getpass
import json
import re
from datetime import UTC, datetime

import typer
import yaml
from pulumi import automation as auto
from rich.console import Console
from rich.table import Table

from gpuyard.infra.config import ConfigError
from gpuyard.infra.regions import COMMERCIAL_REGIONS
from gpuyard.jobs.cli.errors import fail, usage_without_command
from gpuyard.jobs.ephemeral.cleanup import Cleaner, CleanupError, Orphan, Report
from gpuyard.jobs.ephemeral.stacks import (CleanupIncomplete, EnvError, EnvStack, TeardownStopped, create_env, destroy_env,
                                   due_for_reaping, ephemeral_cluster_prefix, leased_env, list_envs, new_env_config)
from gpuyard.jobs.duration import DurationError
from gpuyard.jobs.ephemeral.ttl import describe_remaining, format_expiry, parse_ttl

app = typer.Typer(help="Ephemeral environments: create with a TTL, tear down completely, reap the expired.",
                  invoke_without_command=True, callback=usage_without_command)

console = Console(highlight=False, markup=False, emoji=False)  # AWS names and Pulumi output print as they are
progress_console = Console(stderr=True, highlight=False, markup=False, emoji=False)  # beside JSON on stdout
# EKS CreateCluster's name constraint (API reference, CreateCluster: name, 1-100 characters).
EKS_CLUSTER_NAME = re.compile(r"^[0-9A-Za-z][A-Za-z0-9\-_]{0,99}$")


def orphan_table(title: str, orphans: list[Orphan], reasons: dict[Orphan, str] | None = None) -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("kind", "id", "name", "detail", *(["why"] if reasons else [])):
        table.add_column(column, overflow="fold")
    for orphan in orphans:
        row = [orphan.kind, orphan.id, orphan.name, orphan.detail]
        table.add_row(*row, *([reasons.get(orphan, "")] if reasons else []))
    return table


def print_report(cluster: str, report: Report) -> None:
    console.print(f"deleted {len(report.deleted)} resource(s) of cluster {cluster}")
    if report.failed:
        console.print(orphan_table("failed", sorted(report.failed), report.failed))
    if report.left:
        console.print(orphan_table("left (rerun `gpuyard env cleanup` to finish)", report.left))
    if report.aborted:
        console.print(f"stopped early: {report.aborted}")


def find_leftovers(cluster: str, region: str | None, force: bool,
                   say: Console = console) -> tuple[Cleaner, list[Orphan]]:
    """Refuse a live or non-ephemeral cluster (unless ``force``), then the cluster's leftovers, with a spinner while
    AWS answers (retries against a slow endpoint take a while)."""
    try:
        cleaner = Cleaner(cluster, region, on_progress=say.print)
        refusal = None if force else cleaner.refusal(ephemeral_cluster_prefix())
        if refusal:
            fail(f"refusing to clean up: {refusal}")
        with say.status(f"listing what cluster {cluster} left in AWS"):
            return cleaner, cleaner.find()
    except (CleanupError, ConfigError) as error:
        fail(str(error))


def orphans_json(orphans: list[Orphan], reasons: dict[Orphan, str] | None = None) -> list[dict]:
    return [{"kind": o.kind, "id": o.id, "name": o.name, "detail": o.detail,
             **({"why": reasons.get(o, "")} if reasons else {})} for o in orphans]


def run_cleanup(cluster: str, region: str | None, *, dry_run: bool, assume_yes: bool, force: bool = False,
                as_json: bool = False) -> Report | None:
    """Refuse, list, confirm, delete; None when nothing was to be done or the user said no."""
    if region is not None and region not in COMMERCIAL_REGIONS:
        fail(f"--region {region!r}: unknown AWS region (e.g. us-east-1, us-west-2, eu-west-1)")
    if not EKS_CLUSTER_NAME.fullmatch(cluster):
        fail(f"--cluster {cluster!r}: not an EKS cluster name (letters, digits, '-' and '_', starting with a letter "
             "or digit, at most 100)")
    cleaner, plan = find_leftovers(cluster, region, force, progress_console if as_json else console)
    if as_json and (dry_run or not plan):
        typer.echo(json.dumps({"cluster": cluster, "found": orphans_json(plan), "deleted": []}, indent=1))
        return None
    if not plan:
        console.print(f"nothing to clean up for cluster {cluster}")
        return None
    if not as_json:
        console.print(orphan_table(f"left in AWS by cluster {cluster} ({len(plan)}), in deletion order", plan))
    if dry_run:
        console.print("dry run: nothing deleted")
        return None
    if not assume_yes and not _confirmed(f"Delete these {len(plan)} resources?"):
        fail("not confirmed, nothing deleted (pass --yes to skip the question)", code=1)
    return cleaner.run(plan)


def _confirmed(question: str) -> bool:
    """typer.confirm, with end of input (no TTY, closed stdin) as "no"."""
    try:
        return typer.confirm(question, default=False)
    except typer.Abort:
        return False


@app.command()
def cleanup(
    cluster: str = typer.Option(..., "--cluster", help="EKS cluster name whose leftovers to delete."),
    region: str | None = typer.Option(None, "--region", help="AWS region (default: AWS_REGION, then AWS_DEFAULT_REGION, "
                                      "then the profile's)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="List what would be deleted; change nothing."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask before deleting."),
    force: bool = typer.Option(False, "--force",
                               help="Also for a cluster that still exists or is not an ephemeral environment's."),
    as_json: bool = typer.Option(False, "--json", help="Print {cluster, found, deleted, failed, left} as JSON."),
) -> None:
    """Delete what Karpenter, the VPC CNI and the load balancer controllers left for CLUSTER, in dependency order."""
    if as_json and not (yes or dry_run):
        fail("--json cannot ask before deleting: add --yes, or --dry-run to only list")
    report = run_cleanup(cluster, region, dry_run=dry_run, assume_yes=yes, force=force, as_json=as_json)
    if report is not None:
        if as_json:
            typer.echo(json.dumps({"cluster": cluster, "deleted": orphans_json(report.deleted),
                                   "failed": orphans_json(sorted(report.failed), report.failed),
                                   "left": orphans_json(report.left), "aborted": report.aborted}, indent=1))
        else:
            print_report(cluster, report)
        if not report.ok:
            raise typer.Exit(1)


def _lease_table(envs: list[EnvStack], now: datetime, title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("stack", "cluster", "owner", "team", "expires at (UTC)", "remaining"):
        table.add_column(column)
    for env in sorted(envs, key=lambda e: e.lease.expires_at):
        lease = env.lease
        table.add_row(env.name, env.cluster_name, lease.owner, lease.team or "", format_expiry(lease.expires_at),
                      describe_remaining(lease.expires_at, now))
    return table


def _pulumi_reason(error: auto.CommandError) -> str:
    """The last line Pulumi wrote on stderr (the Automation API packs code, stdout and stderr into one text)."""
    lines = [line.strip() for line in str(error).split(" stderr:", 1)[-1].splitlines() if line.strip()]
    return lines[-1] if lines else "see the output above"


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        raise EnvError("cannot tell who you are: pass --owner NAME") from None


@app.command()
def create(
    name: str = typer.Argument(..., help="Environment (stack) name, e.g. pr-123."),
    ttl: str = typer.Option(..., "--ttl", metavar="DURATION", help="Lifetime: 90s, 30m, 8h, 2d, 1h30m (1m to 30d)."),
    team: str | None = typer.Option(None, "--team", help="Team of stacks/Pulumi.ephemeral.yaml it is for."),
    owner: str | None = typer.Option(None, "--owner", help="Who answers for it [default: your user name]."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Check everything and print the stack config; create nothing."),
) -> None:
    """Create and deploy stack NAME from stacks/Pulumi.ephemeral.yaml, leased until now + TTL."""
    if owner is not None and not owner.strip():
        fail("--owner is empty: name who answers for the environment")
    try:
        lifetime = parse_ttl(ttl)
    except DurationError as error:
        fail(f"--ttl: {error}")
    try:
        if dry_run:
            values = new_env_config(name, lifetime, owner or _user(), team, datetime.now(UTC))
            typer.echo(yaml.safe_dump({"config": values}, sort_keys=False), nl=False)
            console.print(f"dry run: stack {name} not created")
            return
        env = create_env(name, lifetime, owner or _user(), team, datetime.now(UTC), console.print)
    except (EnvError, ConfigError) as error:
        fail(str(error))
    except auto.CommandError as error:
        fail(f"pulumi up of {name} failed: {_pulumi_reason(error)} (`gpuyard env destroy {name}` removes it)", code=1)
    console.print(f"{env.name} is up: cluster {env.cluster_name}, expires {format_expiry(env.lease.expires_at)}")


@app.command("list")
def list_(as_json: bool = typer.Option(False, "--json", help="Print [{stack, cluster, region, owner, team, "
                                                              "expires_at}] as JSON.")) -> None:
    """The ephemeral stacks, their owners and expiry."""
    try:
        envs = list_envs()
    except EnvError as error:
        fail(str(error))
    except auto.CommandError as error:
        fail(f"listing stacks failed: {_pulumi_reason(error)}", code=1)
    if as_json:
        typer.echo(json.dumps([{"stack": e.name, "cluster": e.cluster_name, "region": e.region,
                                "owner": e.lease.owner, "team": e.lease.team,
                                "expires_at": format_expiry(e.lease.expires_at)} for e in envs], indent=1))
        return
    if not envs:
        console.print("no ephemeral environments")
        return
    console.print(_lease_table(envs, datetime.now(UTC), f"ephemeral environments ({len(envs)})"))


def _destroy(name: str) -> bool:
    """Destroy one environment; False (after saying why, in one line on stderr) when it stopped or left something."""
    try:
        destroy_env(name, console.print)
    except CleanupIncomplete as error:
        print_report(error.cluster, error.report)
        typer.echo(f"gpuyard: error: {name}: {error}", err=True)
        return False
    except TeardownStopped as error:
        typer.echo(f"gpuyard: error: {name}: {error}", err=True)
        return False
    except CleanupError as error:
        typer.echo(f"gpuyard: error: {name}: {error}; stack not removed", err=True)
        return False
    except auto.CommandError as error:
        typer.echo(f"gpuyard: error: {name}: pulumi failed: {_pulumi_reason(error)}", err=True)
        return False
    console.print(f"{name}: destroyed")
    return True


@app.command()
def destroy(
    name: str = typer.Argument(..., help="Environment (stack) name."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask before destroying."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show the lease and the leftovers to delete; change nothing."),
) -> None:
    """Drain Karpenter's NodePools, pulumi destroy, delete the cluster's leftovers, stack rm."""
    try:
        _, env = leased_env(name)
    except EnvError as error:
        fail(str(error))
    console.print(_lease_table([env], datetime.now(UTC), f"environment {name}"))
    if dry_run:
        _, plan = find_leftovers(env.cluster_name, env.region or None, force=True)  # a leased env, listing only
        console.print(orphan_table(f"left in AWS by cluster {env.cluster_name} ({len(plan)}), deleted after "
                                   "pulumi destroy", plan))
        console.print("dry run: nothing destroyed")
        return
    if not yes and not _confirmed(f"Destroy environment {name} and everything in cluster {env.cluster_name}?"):
        fail("not confirmed, nothing destroyed (pass --yes to skip the question)", code=1)
    try:
        done = _destroy(name)
    except EnvError as error:
        fail(str(error))
    if not done:
        raise typer.Exit(1)


@app.command()
def reap(dry_run: bool = typer.Option(False, "--dry-run", help="Show what would be destroyed; change nothing.")) -> None:
    """Destroy every ephemeral stack whose lease has expired."""
    now = datetime.now(UTC)
    try:
        due = due_for_reaping(list_envs(), now)
    except EnvError as error:
        fail(str(error))
    except auto.CommandError as error:
        fail(f"listing stacks failed: {_pulumi_reason(error)}", code=1)
    if not due:
        console.print("no expired environments")
        return
    console.print(_lease_table(due, now, f"expired ({len(due)})"))
    if dry_run:
        console.print("dry run: nothing destroyed")
        return
    failed = [env.name for env in due if not _destroy(env.name)]
    if failed:
        fail(f"not destroyed: {', '.join(failed)} (rerun `gpuyard env reap`)", code=1)
