"""``gpuyard plan``: what ``pulumi up`` would create for a stack, computed offline under Pulumi's mocks."""

from __future__ import annotations

import json

import typer

from infra.config import ConfigError
from jobs.cli.errors import fail


def plan_command(
    stack: str = typer.Option("dev", "--stack", help="Stack file stacks/Pulumi.<stack>.yaml to plan."),
    as_json: bool = typer.Option(False, "--json", help="A JSON list of {type, name, parent, inputs}."),
) -> None:
    """Run the real Pulumi program with mocks: a tree by component with counts per type (no cloud, no CLI)."""
    from infra.plan import format_tree, plan  # the Pulumi SDKs load only when planning

    try:
        resources = plan(stack).resources
    except ConfigError as error:
        fail(str(error))
    if as_json:
        typer.echo(json.dumps([resource.to_json() for resource in resources], indent=1, sort_keys=True))
    else:
        typer.echo(format_tree(stack, resources))
