"""``gpuyard plan``: what ``pulumi up`` would create for a stack, computed offline under Pulumi's mocks."""

from __future__ import annotations

import json

import typer

from gpuyard.infra.config import ConfigError
from gpuyard.jobs.cli.errors import fail
from gpuyard.jobs.cli.options import stack_option


def plan_command(
    stack: str = stack_option("Stack file stacks/Pulumi.<stack>.yaml to plan."),
    as_json: bool = typer.Option(False, "--json",
                                 help='{"resources": [{type, name, parent, inputs}], "policies": {...}, "create": N}.'),
) -> None:
    """Run the real Pulumi program with mocks and show it like `pulumi preview`: every resource by type and name,
    the policy pack's verdicts, `+ N to create` (no cloud, no Pulumi CLI). Exit 1 on a policy violation."""
    from gpuyard.infra.plan import format_preview, plan, policy_verdicts  # the Pulumi SDKs load only when planning

    try:
        resources = plan(stack).resources
    except ConfigError as error:
        fail(str(error))
    verdicts = policy_verdicts(resources)
    if as_json:
        document = {"resources": [resource.to_json() for resource in resources], "policies": verdicts,
                    "create": len(resources)}
        typer.echo(json.dumps(document, indent=1, sort_keys=True))
    else:
        typer.echo(format_preview(stack, resources, verdicts))
    if any(verdicts.values()):
        raise typer.Exit(1)
