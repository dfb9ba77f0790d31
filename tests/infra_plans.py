"""Shared helpers for the infra tests: plans of the stack files, cached per process, and lookups."""

from __future__ import annotations

from functools import cache

from gpuyard.infra.plan import Plan, PlannedResource, plan


@cache
def stack_plan(stack: str) -> Plan:
    return plan(stack)


def planned(stack: str) -> tuple[PlannedResource, ...]:
    return tuple(stack_plan(stack).resources)


def of_type(resources, type_: str) -> list[PlannedResource]:
    return [resource for resource in resources if resource.type == type_]


def named(resources, name: str, type_: str | None = None) -> PlannedResource:
    """The one resource called ``name`` (of ``type_`` when several types share the name)."""
    (match,) = [r for r in resources if r.name == name and type_ in (None, r.type)]
    return match


def kubernetes_manifests(resources) -> list[dict]:
    """The Kubernetes objects the program creates, as manifests (apiVersion, kind, metadata, spec/data/...)."""
    return [r.inputs for r in resources if r.type.startswith("kubernetes:") and "kind" in r.inputs]
