"""The plan grows linearly with the team list: a fixed platform plus the same set of resources per team."""

from __future__ import annotations

from collections import Counter

from gpuyard.infra.config import load_stack
from gpuyard.infra.plan import plan_values, stack_values
from gpuyard.infra.tenancy import team_network_policies
from gpuyard.infra.trainer_runtime import runtime_pools


def teams(count: int) -> list[dict]:
    return [{"name": f"team{i:03d}", "gpu_quota": 4} for i in range(count)]


def test_resource_count_is_linear_in_teams():
    base = stack_values("dev")
    plans = {n: plan_values("dev", {**base, "gpuyard:teams": teams(n)}).resources for n in (1, 10, 50)}
    counts = {n: len(resources) for n, resources in plans.items()}
    per_team = (counts[10] - counts[1]) // 9
    # the Team component, 9 children, a TrainingRuntime per pool (Trainer v2 is on in dev) and its NetworkPolicies
    runtimes = len(runtime_pools(load_stack("dev")))
    assert per_team == 10 + runtimes + len(team_network_policies())
    assert counts[50] - counts[10] == 40 * per_team
    assert counts[1] - per_team == counts[50] - 50 * per_team
    team_types = Counter(r.type for r in plans[50] if r.parent.startswith("team") or r.type == "gpuyard:tenancy:Team")
    assert set(team_types.values()) == {50, 50 * runtimes, 50 * len(team_network_policies())}
