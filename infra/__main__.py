"""The gpuyard stack: read the stack's config once at the edge, compose the components, export outputs."""

import json

import pulumi
import pulumi_aws as aws
from pulumi.runtime.config import CONFIG, get_config_env

from infra.cluster import Cluster, ClusterArgs
from infra.config import StackConfig, parse_stack
from infra.network import Network, NetworkArgs


def config_values() -> dict:
    """All config values of this stack; structured ones (objects, lists) arrive JSON-encoded."""
    raw = {**get_config_env(), **CONFIG.get()}
    return {key: json.loads(value) if value[:1] in "[{" else value for key, value in raw.items()}


def build(config: StackConfig) -> dict[str, pulumi.Input]:
    """Create every component of the stack and return its outputs."""
    aws_provider = aws.Provider("aws", region=config.region, default_tags={"tags": {"gpuyard.io/stack": config.stack}})
    network = Network("network", NetworkArgs(config.cluster_name, config.network, aws_provider))
    cluster = Cluster(
        "cluster",
        ClusterArgs(config.cluster_name, config.region, config.cluster, network.private_subnet_ids, aws_provider),
    )
    return {
        "cluster_name": cluster.name,
        "kubeconfig": cluster.kubeconfig,
        "vpc_id": network.vpc_id,
    }


for output_name, value in build(parse_stack(pulumi.get_stack(), config_values())).items():
    pulumi.export(output_name, value)
