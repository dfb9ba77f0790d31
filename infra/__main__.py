"""The gpuyard stack: read the stack's config once at the edge, compose the components, export outputs."""

import pulumi
import pulumi_aws as aws
from pulumi.runtime.config import CONFIG, get_config_env

from gpuyard.infra.addons import Addons, AddonsArgs
from gpuyard.infra.cluster import Cluster, ClusterArgs
from gpuyard.infra.config import StackConfig, parse_stack
from gpuyard.infra.conventions import TAG_STACK
from gpuyard.infra.images import kept_tags
from gpuyard.infra.karpenter import Karpenter, KarpenterArgs
from gpuyard.infra.monitoring import Monitoring, MonitoringArgs
from gpuyard.infra.network import Network, NetworkArgs
from gpuyard.infra.showback import stack_instance_types
from gpuyard.infra.storage import Storage, StorageArgs
from gpuyard.infra.trainer_runtime import runtime_pools
from gpuyard.infra.tenancy import (PodAdmission, PodAdmissionArgs, PriorityClasses, PriorityClassesArgs, TeamArgs,
                           TeamTenancy, deserved_gpus)


def config_values() -> dict[str, str]:
    """All config values of this stack, as the Pulumi runtime hands them over."""
    return {**get_config_env(), **CONFIG.get()}


def build(config: StackConfig) -> dict[str, pulumi.Input]:
    """Create every component of the stack and return its outputs."""
    aws_provider = aws.Provider("aws", region=config.region, default_tags={"tags": {TAG_STACK: config.stack}})
    pulumi.log.info(config.cluster.endpoint_notice(config.network.cidr))
    network = Network("network", NetworkArgs(config.cluster_name, config.network, aws_provider))
    cluster = Cluster(
        "cluster",
        ClusterArgs(config.cluster_name, config.region, config.cluster, network.private_subnet_ids, aws_provider,
                    vpc_cidr=config.network.cidr, protect_logs=config.storage.protect),
    )
    k8s = cluster.k8s_provider
    after_cluster = pulumi.ResourceOptions(depends_on=[cluster])
    Karpenter(
        "karpenter",
        KarpenterArgs(
            cluster_name=config.cluster_name,
            region=config.region,
            config=config.karpenter,
            cluster_endpoint=cluster.endpoint,
            cluster_arn=cluster.arn,
            security_group_id=cluster.security_group_id,
            oidc_provider_arn=cluster.oidc_provider_arn,
            oidc_issuer=cluster.oidc_issuer,
            aws_provider=aws_provider,
            k8s_provider=k8s,
            efa_zone=network.zones[0],  # the managed EFA groups' zone too (infra/cluster.py, first private subnet)
            system_nodes=config.cluster.system_node_group.min_size,
        ),
        opts=after_cluster,
    )
    addons = Addons("addons", AddonsArgs(config.addons, k8s))
    Monitoring("monitoring", MonitoringArgs(k8s, tuple(stack_instance_types(config))))
    PriorityClasses("priority", PriorityClassesArgs(k8s))
    PodAdmission("pod-admission", PodAdmissionArgs(k8s))
    storage = Storage(
        "storage",
        StorageArgs(config.cluster_name, config.checkpoint_bucket, config.storage, aws_provider, kept_tags(config)),
    )
    # Teams' TrainingRuntimes run the ddp image from the stack's own ECR repository.
    trainer_image = storage.repository_urls.apply(lambda urls: f"{urls['ddp']}:{config.image_tag}")
    shares = deserved_gpus(config.teams, config.karpenter.gpu_limit)
    teams = {
        team.name: TeamTenancy(
            f"team-{team.name}",
            TeamArgs(
                team, cluster.name, storage.bucket_arn, cluster.oidc_provider_arn, cluster.oidc_issuer, addons,
                aws_provider, k8s, trainer=addons.trainer, trainer_image=team.image or trainer_image,
                runtime_pools=runtime_pools(config), checkpoint_bucket=config.checkpoint_bucket,
                deserved_gpus=shares[team.name],
            ),
        )
        for team in config.teams
    }
    return {
        "cluster_name": cluster.name,
        "kubeconfig": cluster.kubeconfig,
        "region": config.region,
        "checkpoint_bucket": storage.bucket_name,
        "ecr_repositories": storage.repository_urls,
        "teams": {
            name: {"namespace": t.namespace, "service_account": t.service_account, "queue": t.queue, "role_arn": t.role_arn}
            for name, t in teams.items()
        },
    }


for output_name, value in build(parse_stack(pulumi.get_stack(), config_values())).items():
    pulumi.export(output_name, value)
