"""``gpuyard env``: ephemeral environments with a TTL, complete teardown, reaping."""

from __future__ import annotations

from datetime import UTC, datetime

import typer
from rich.console import Console
from rich.table import Table

from jobs.cli.errors import fail
from jobs.cli.main import app
from jobs.ephemeral.cleanup import Cleaner, CleanupError, Orphan, Report

env_app = typer.Typer(help="Ephemeral environments: create with a TTL, tear down completely, reap the expired.",
                      no_args_is_help=True)
app.add_typer(env_app, name="env")

console = Console(highlight=False)


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


def run_cleanup(cluster: str, region: str | None, *, dry_run: bool, assume_yes: bool) -> Report | None:
    """List, confirm, delete; None when nothing was to be done or the user said no."""
    try:
        cleaner = Cleaner(cluster, region, on_progress=console.print)
        plan = cleaner.find()
    except CleanupError as error:
        fail(str(error))
    if not plan:
        console.print(f"nothing to clean up for cluster {cluster}")
        return None
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


@env_app.command()
def cleanup(
    cluster: str = typer.Option(..., "--cluster", help="EKS cluster name whose leftovers to delete."),
    region: str | None = typer.Option(None, "--region", help="AWS region (default: the AWS SDK's)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="List what would be deleted; change nothing."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask before deleting."),
) -> None:
    """Delete what Karpenter and the load balancer controller left for CLUSTER, in dependency order."""
    report = run_cleanup(cluster, region, dry_run=dry_run, assume_yes=yes)
    if report is not None:
        print_report(cluster, report)
        if not report.ok:
            raise typer.Exit(1)


def _now() -> datetime:
    return datetime.now(UTC)
