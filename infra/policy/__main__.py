"""The gpuyard CrossGuard policy pack: ``pulumi preview --policy-pack infra/policy``."""

from pulumi_policy import EnforcementLevel, PolicyPack

from gpuyard.infra.policy.rules import POLICIES

PolicyPack("gpuyard", enforcement_level=EnforcementLevel.MANDATORY, policies=POLICIES)
