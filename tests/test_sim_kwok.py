"""The kwok stages `gpuyard sim` writes (sim/kwok.py): no pod matches two completion stages, because kwok v0.8.0
picks one at random among the stages that match (sigs.k8s.io/kwok pkg/utils/lifecycle/lifecycle.go)."""

from __future__ import annotations

import itertools

import yaml

from gpuyard.sim.kwok import write_config


def _excluded(one: dict, other: dict) -> bool:
    """Whether a requirement of ``one`` and one of ``other`` on the same key cannot both hold."""
    for a, b in itertools.product(one["spec"]["selector"]["matchExpressions"],
                                  other["spec"]["selector"]["matchExpressions"]):
        if a["key"] != b["key"]:
            continue
        by_op = {a["operator"]: a.get("values", []), b["operator"]: b.get("values", [])}
        if "In" in by_op and ("DoesNotExist" in by_op or set(by_op["In"]) <= set(by_op.get("NotIn", ()))):
            return True
    return False


def test_no_pod_matches_two_completion_stages(tmp_path):
    stages = list(yaml.safe_load_all(write_config(tmp_path / "kwok.yaml").read_text()))
    completing = [s for s in stages if s["spec"]["resourceRef"]["kind"] == "Pod"
                  and "phase: Succeeded" in s["spec"]["next"].get("statusTemplate", "").replace("'", "").replace('"', "")]
    assert {s["metadata"]["name"] for s in completing} >= {"pod-complete", "gpuyard-training-complete"}, completing
    for one, other in itertools.combinations(completing, 2):
        assert _excluded(one, other), (one["metadata"]["name"], other["metadata"]["name"])
