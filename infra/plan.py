"""Offline plan: run the real program (``infra/__main__.py``) under Pulumi's mocks and record what it creates.

No cloud, no Pulumi CLI: :class:`PlanMocks` answers every resource registration with its inputs plus
plausible outputs (ARNs, ids, endpoints) and the provider calls the program makes (the region's AZs).
"""

from __future__ import annotations

import asyncio
import json
import re
import runpy
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import yaml
from pulumi.runtime import rpc, settings
from pulumi.runtime.config import set_all_config
from pulumi.runtime.mocks import MockMonitor
from pulumi.runtime.stack import run_in_stack
from pulumi.runtime.sync_await import _sync_await

from gpuyard.infra.config import PROJECT, load_stack, parse_stack, stack_file
from gpuyard.infra.signals import signals_deferred

PROGRAM = Path(__file__).resolve().parent / "__main__.py"
ACCOUNT_ID = "123456789012"
ROOT = "root"
SECRET = "[secret]"


@dataclass(frozen=True)
class PlannedResource:
    type: str
    name: str
    parent: str
    inputs: dict[str, Any]
    urn: str = ""
    provider: str = ""  # the explicit provider reference (``<urn>::<id>``), empty for components
    property_dependencies: dict[str, list[str]] = field(default_factory=dict)
    dependencies: list[str] = field(default_factory=list)  # urns it waits for on create and outlives on destroy
    protect: bool = False
    retain_on_delete: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "name": self.name, "parent": self.parent, "inputs": self.inputs}


def _service(type_: str) -> str:
    return type_.split(":")[1].split("/")[0]


@dataclass
class PlanMocks(pulumi.runtime.Mocks):
    """Answers registrations with their inputs plus what providers would compute (ARNs, ids, endpoints)."""

    region: str
    account_roles: tuple[str, ...] = ()  # IAM roles the account already has (``aws.iam.get_roles`` finds them)

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        name = args.inputs.get("name") or args.name
        outputs = {
            **args.inputs,
            "name": name,
            "arn": f"arn:aws:{_service(args.typ)}:{self.region}:{ACCOUNT_ID}:{name}",
        }
        outputs.update(self._computed(args.typ, name, args.inputs))
        return f"{args.name}-id", outputs

    def _computed(self, type_: str, name: str, inputs: dict[str, Any]) -> dict[str, Any]:
        if type_ == "aws:eks/cluster:Cluster":
            return {
                "endpoint": f"https://{name}.gr7.{self.region}.eks.amazonaws.com",
                "certificateAuthority": {"data": "LS0tLS1CRUdJTi1DRVJUSUZJQ0FURS0tLS0t"},
                "identities": [{"oidcs": [{"issuer": f"https://oidc.eks.{self.region}.amazonaws.com/id/{name.upper()}"}]}],
                "vpcConfig": {**inputs.get("vpcConfig", {}), "clusterSecurityGroupId": f"sg-{name}"},
            }
        if type_ == "aws:iam/openIdConnectProvider:OpenIdConnectProvider":
            return {"arn": f"arn:aws:iam::{ACCOUNT_ID}:oidc-provider/{inputs['url'].removeprefix('https://')}"}
        if type_ == "aws:iam/role:Role":
            return {"arn": f"arn:aws:iam::{ACCOUNT_ID}:role/{name}"}
        if type_ == "aws:s3/bucket:Bucket":
            bucket = inputs.get("bucket", name)
            return {"bucket": bucket, "arn": f"arn:aws:s3:::{bucket}"}
        if type_ == "aws:ecr/repository:Repository":
            return {"repositoryUrl": f"{ACCOUNT_ID}.dkr.ecr.{self.region}.amazonaws.com/{inputs.get('name', name)}"}
        if type_ == "aws:sqs/queue:Queue":
            return {"url": f"https://sqs.{self.region}.amazonaws.com/{ACCOUNT_ID}/{inputs.get('name', name)}"}
        if type_ == "aws:ec2/launchTemplate:LaunchTemplate":
            return {"latestVersion": 1}
        if type_ == "aws:kms/key:Key":
            return {"keyId": f"{name}-key-id"}
        return {}

    def call(self, args: pulumi.runtime.MockCallArgs):
        if args.token == "aws:index/getAvailabilityZones:getAvailabilityZones":
            return {"names": [f"{self.region}{letter}" for letter in "abcd"], "id": self.region}
        if args.token == "aws:iam/getRoles:getRoles":
            names = [r for r in self.account_roles if re.search(args.args.get("nameRegex", ""), r)]
            return {"names": names, "arns": [f"arn:aws:iam::{ACCOUNT_ID}:role/{r}" for r in names], "id": "roles"}
        raise ValueError(f"plan mocks do not answer {args.token}")


class RecordingMonitor(MockMonitor):
    """The mock monitor, also keeping each registration in order with its parent's name."""

    def __init__(self, mocks: PlanMocks):
        super().__init__(mocks)
        self.planned: list[PlannedResource] = []
        self.outputs: dict[str, Any] = {}

    def RegisterResourceOutputs(self, request):
        if _urn_type(request.urn) == "pulumi:pulumi:Stack":
            self.outputs = _plain(rpc.deserialize_properties(request.outputs))
        return super().RegisterResourceOutputs(request)

    def RegisterResource(self, request):
        response = super().RegisterResource(request)
        if request.type != "pulumi:pulumi:Stack":
            parent = _urn_name(request.parent) if _urn_type(request.parent) != "pulumi:pulumi:Stack" else ROOT
            inputs = rpc.deserialize_properties(request.object)
            dependencies = {key: list(deps.urns) for key, deps in request.propertyDependencies.items()}
            self.planned.append(
                PlannedResource(
                    request.type, request.name, parent, _plain(inputs), response.urn, request.provider, dependencies,
                    list(request.dependencies), request.protect, request.retainOnDelete,
                )
            )
        return response


def _urn_type(urn: str) -> str:
    return urn.split("::")[2].split("$")[-1] if urn else "pulumi:pulumi:Stack"


def _urn_name(urn: str) -> str:
    return urn.split("::", 3)[3]


def _plain(value: Any) -> Any:
    """Inputs as JSON values: secrets become "[secret]", unknowns and resource references strings, and whole numbers
    (which Pulumi's wire format carries as floats) become ints again."""
    return json.loads(json.dumps(value, default=str), parse_float=_number, object_hook=_hide_secret)


def _hide_secret(value: dict[str, Any]) -> Any:
    return SECRET if value.get(rpc._special_sig_key) == rpc._special_secret_sig else value


def _number(text: str) -> int | float:
    number = float(text)
    return int(number) if number.is_integer() else number


def encode_config(values: dict[str, Any]) -> dict[str, str]:
    """Config values as the Pulumi engine hands them to a program: strings, structured values as JSON."""
    return {key: value if isinstance(value, str) else json.dumps(value) for key, value in values.items()}


def stack_values(stack: str, directory: Path | None = None) -> dict[str, Any]:
    """The raw ``config:`` mapping of ``Pulumi.<stack>.yaml`` (validated first, so errors are one line)."""
    load_stack(stack, directory)
    return yaml.safe_load(stack_file(stack, directory).read_text()).get("config") or {}


@dataclass(frozen=True)
class Plan:
    """Every resource the program registers, in order, and the stack outputs it exports."""

    resources: list[PlannedResource]
    outputs: dict[str, Any]


@contextmanager
def _own_event_loop() -> Iterator[None]:
    """A fresh asyncio loop for one run of the program, closed after it with the tasks the run left pending; the
    caller's loop is set again afterwards. A run that raises leaves tasks waiting on its resources: in a loop the
    next run shares they would go on registering with that run's monitor, whose wait for its RPCs (Pulumi 3.272
    ``pulumi/runtime/stack.py`` wait_for_rpcs) would then never end."""
    policy = asyncio.get_event_loop_policy()
    try:
        previous = policy.get_event_loop()
    except RuntimeError:
        previous = None
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        yield
    finally:
        left = asyncio.all_tasks(loop)
        for task in left:
            task.cancel()
        if left:
            loop.run_until_complete(asyncio.wait(left, timeout=10))
        loop.close()
        asyncio.set_event_loop(previous)


def plan_values(stack: str, values: dict[str, Any], account_roles: tuple[str, ...] = ()) -> Plan:
    """Run the program for ``stack`` with these config values (in an account that has ``account_roles``);
    return what it registers and exports."""
    config = parse_stack(stack, values)
    monitor = RecordingMonitor(PlanMocks(region=config.region, account_roles=account_roles))
    with _own_event_loop():  # Pulumi's futures bind to the loop that is current when set_mocks makes them
        settings.reset_options(project=PROJECT, stack=stack, preview=False)
        set_all_config(encode_config(values))
        pulumi.runtime.set_mocks(monitor.mocks, project=PROJECT, stack=stack, preview=False, monitor=monitor)
        settings.set_root_resource(None)  # set_mocks finished a root stack up front; run in a fresh one, as `pulumi up` does
        with signals_deferred():  # Pulumi's event loop swallows a KeyboardInterrupt raised in it, then waits forever
            _sync_await(run_in_stack(lambda: runpy.run_path(str(PROGRAM), run_name="__main__")))
    return Plan(monitor.planned, monitor.outputs)


def plan(stack: str, directory: Path | None = None) -> Plan:
    """Plan a stack file: ``Pulumi.<stack>.yaml`` under ``stacks/`` (or ``directory``)."""
    return plan_values(stack, stack_values(stack, directory))


def policy_verdicts(resources: list[PlannedResource]) -> dict[str, list[str]]:
    """Each CrossGuard rule of ``infra/policy`` run on the plan: ``{policy: ["resource: violation", ...]}``."""
    from gpuyard.infra.policy.rules import RESOURCE_CHECKS, STACK_CHECKS

    verdicts = {name: [f"{r.name}: {message}" for r in resources for message in check(r.type, r.inputs)]
                for name, (_, check) in RESOURCE_CHECKS.items()}
    stack_view = [(r.urn, r.type, r.inputs, r.property_dependencies) for r in resources]
    verdicts.update({name: check(stack_view) for name, (_, check) in STACK_CHECKS.items()})
    return verdicts


def format_preview(stack: str, resources: list[PlannedResource], verdicts: dict[str, list[str]]) -> str:
    """What ``pulumi preview`` prints: the resource tree (type, name), the policy pack's verdicts, a summary."""
    children: dict[str, list[PlannedResource]] = {}
    for resource in resources:
        children.setdefault(resource.parent, []).append(resource)
    rows = [("pulumi:pulumi:Stack", f"{PROJECT}-{stack}")]

    def walk(parent: str, prefix: str) -> None:
        kids = children.get(parent, [])
        for index, kid in enumerate(kids):
            last = index == len(kids) - 1
            rows.append((f"{prefix}{'└─' if last else '├─'} {kid.type}", kid.name))
            walk(kid.name, prefix + ("   " if last else "│  "))

    walk(ROOT, "")
    width = min(max(len(type_) for type_, _ in rows), 72) + 3
    violations = sum(len(found) for found in verdicts.values())
    lines = [f"Previewing update ({stack}), offline under Pulumi's mocks:", "",
             f"     {'Type':<{width}}Name", *(f" +   {type_:<{width}}{name}" for type_, name in rows), "",
             "Policies:",
             f"    {'❌' if violations else '✅'} gpuyard (infra/policy): {len(verdicts)} policies, {violations} violations"]
    for name, found in verdicts.items():
        lines.append(f"        {'fail' if found else 'pass'}  {name}")
        lines.extend(f"              - {message}" for message in found)
    lines += ["", "Resources:", f"    + {len(resources)} to create"]
    return "\n".join(lines)


def plan_summary(stack: str) -> tuple[int, dict[str, int]]:
    """(number of resources, count per type) for ``gpuyard demo``."""
    resources = plan(stack).resources
    return len(resources), dict(Counter(resource.type for resource in resources))


