"""Cluster: EKS control plane, IRSA, KMS secrets encryption, and system + GPU managed node groups."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as kubernetes

from gpuyard.infra.config import ClusterConfig, GpuNodeGroupConfig, NodeGroupConfig
from gpuyard.infra.conventions import (GPU_TAINT_KEY, GPU_TAINT_VALUE, HUGEPAGES_EFA_NODE_PAGES, LABEL_EFA_PRESENT,
                               LABEL_GPU_PRESENT, LABEL_NODE_GROUP)
from gpuyard.infra.gpu_access import toolkit_script
from gpuyard.infra.policies import service_assume_role_policy

AMI_SYSTEM = "AL2023_x86_64_STANDARD"
AMI_GPU = "AL2023_x86_64_NVIDIA"
LABEL_GPU_NODE = "gpuyard.io/gpu-node"
LABEL_SYSTEM_NODE = "gpuyard.io/system-node"
SYSTEM_NODES = {LABEL_SYSTEM_NODE: "true"}  # node selector for controllers (Karpenter, operators, Prometheus)
MANAGED = "arn:aws:iam::aws:policy"
NODE_POLICIES = (
    "AmazonEKSWorkerNodePolicy",
    "AmazonEKS_CNI_Policy",
    "AmazonEC2ContainerRegistryReadOnly",
    "AmazonSSMManagedInstanceCore",
)
CLUSTER_ADMIN_POLICY = "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"
EKS_ADDONS = ("vpc-cni", "coredns", "kube-proxy")
# The vpc-cni add-on enforces NetworkPolicies only when asked to (add-on configuration value, a string;
# awsdocs/amazon-eks-user-guide latest/ug/networking/cni-network-policy-configure.adoc).
ADDON_CONFIGURATION = {"vpc-cni": {"enableNetworkPolicy": "true"}}
# EKS installs vpc-cni, coredns and kube-proxy itself when it creates a cluster; creating the managed add-on over
# them with configuration values fails on any conflicting field unless conflicts are resolved by OVERWRITE
# (awsdocs/amazon-eks-user-guide latest/ug/workloads/eks-add-ons.adoc, --resolve-conflicts OVERWRITE: "If you remove
# the option, and the Amazon EKS add-on needs to overwrite the configuration of an existing self-managed add-on, then
# creation of the Amazon EKS add-on fails"). The stack's configuration values are the source of truth on updates too.
ADDON_CONFLICTS = "OVERWRITE"
API_PORT = 443
# Managed EFA nodes reserve libfabric's 2 MiB huge pages before the kubelet starts, so it advertises them as
# hugepages-2Mi and EFA pods requesting them schedule. The AL2023 AMI's sources set none: its EFA step is
# `efa_installer.sh --minimal -y` (awslabs/amazon-eks-ami v20260724, templates/al2023/provisioners/install-efa.sh)
# and no template or nodeadm file sets vm.nr_hugepages; the EKS user guide (latest/ug/ml/node-efa.adoc) says
# instances with the EFA driver "pre-allocate 5128 2MiB Huge Pages", a claim about the installer the AMI's sources
# cannot confirm, so the node group sets the same number itself. User data of a managed group with the EKS AMI is a
# MIME multi-part archive merged with EKS's own (latest/ug/nodes/launch-templates.adoc); its shell script runs in
# cloud-init's final stage, and nodeadm-run.service, which starts the kubelet, is ordered After=cloud-final.service
# (amazon-eks-ami v20260724, templates/al2023/runtime/rootfs/etc/systemd/system/nodeadm-run.service).
HUGEPAGES_SYSCTL_FILE = "/etc/sysctl.d/90-gpuyard-efa-hugepages.conf"


def control_plane_log_group(cluster_name: str) -> str:
    """Where EKS writes control-plane logs; it creates the group itself, outside the stack, unless it exists."""
    return f"/aws/eks/{cluster_name}/cluster"


def gpu_node_taints() -> list[dict[str, str]]:
    """The EKS spelling of the GPU taint every GPU node carries (``nvidia.com/gpu=true:NoSchedule``)."""
    return [{"key": GPU_TAINT_KEY, "value": GPU_TAINT_VALUE, "effect": "NO_SCHEDULE"}]


def node_labels(group: NodeGroupConfig) -> dict[str, str]:
    """A group's own labels, its name, and what the DaemonSets serving it select (GPU and EFA presence)."""
    labels = {**group.labels, LABEL_NODE_GROUP: group.name}
    if isinstance(group, GpuNodeGroupConfig):
        labels.update({LABEL_GPU_NODE: "true", LABEL_GPU_PRESENT: "true"})
        if group.efa:
            labels[LABEL_EFA_PRESENT] = "true"
    else:
        labels[LABEL_SYSTEM_NODE] = "true"
    return labels


def efa_network_interfaces(cards: int, security_group_id: pulumi.Input[str]) -> list[dict]:
    """One EFA interface per network card: the primary on card 0 (device 0), the others device 1 of each card,
    as terraform-aws-modules/terraform-aws-eks (modules/eks-managed-node-group/main.tf) lays them out."""
    return [
        {
            "device_index": 0 if card == 0 else 1,
            "network_card_index": card,
            "interface_type": "efa",
            "delete_on_termination": "true",
            "security_groups": [security_group_id],
        }
        for card in range(cards)
    ]


def efa_hugepages_script(pages: int = HUGEPAGES_EFA_NODE_PAGES) -> str:
    """The shell script reserving ``pages`` 2 MiB huge pages now and at every boot; it fails when the kernel
    reserved fewer."""
    return (
        "#!/bin/bash\n"
        "# gpuyard: libfabric's 2 MiB huge pages for EFA pods, reserved before the kubelet starts\n"
        "set -euo pipefail\n"
        f"echo 'vm.nr_hugepages = {pages}' > {HUGEPAGES_SYSCTL_FILE}\n"
        f"sysctl -w vm.nr_hugepages={pages}\n"
        f"test \"$(cat /proc/sys/vm/nr_hugepages)\" -ge {pages}\n"
    )


def node_user_data(scripts: list[str]) -> str:
    """Base64 MIME multi-part user data holding one shell part per script, for EKS to merge with its own."""
    archive = MIMEMultipart(boundary="==GPUYARD==")
    for script in scripts:
        archive.attach(MIMEText(script, "x-shellscript"))
    return base64.b64encode(archive.as_bytes()).decode()


def launch_template_spec(
    disk_gib: int, efa_security_group_id: pulumi.Input[str] | None = None, efa_interfaces: int = 0, gpu: bool = False
) -> dict:
    """Launch template inputs for managed nodes: IMDSv2 only with hop limit 1 (pods use IRSA and cannot reach the
    node role's credentials), encrypted gp3 root.

    With ``efa_interfaces`` the node gets that many EFA interfaces (one per network card) in the
    ``efa_security_group_id`` (cluster) security group, which lets EFA traffic flow between the nodes, and reserves
    the huge pages EFA pods request (``efa_hugepages_script``). GPU nodes set the container toolkit so only pods
    that request GPUs get them (``toolkit_script``).
    """
    spec: dict = {
        "metadata_options": {
            "http_endpoint": "enabled",
            "http_tokens": "required",
            "http_put_response_hop_limit": 1,
        },
        "block_device_mappings": [
            {
                "device_name": "/dev/xvda",
                "ebs": {"volume_size": disk_gib, "volume_type": "gp3", "encrypted": "true", "delete_on_termination": "true"},
            }
        ],
    }
    scripts = [toolkit_script()] if gpu else []
    if efa_interfaces:
        spec["network_interfaces"] = efa_network_interfaces(efa_interfaces, efa_security_group_id)
        scripts.append(efa_hugepages_script())
    if scripts:
        spec["user_data"] = node_user_data(scripts)
    return spec


def kubeconfig(cluster_name: str, endpoint: str, ca_data: str, region: str) -> dict:
    """A kubeconfig that authenticates with ``aws eks get-token``."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster_name, "cluster": {"server": endpoint, "certificate-authority-data": ca_data}}],
        "contexts": [{"name": cluster_name, "context": {"cluster": cluster_name, "user": cluster_name}}],
        "current-context": cluster_name,
        "users": [
            {
                "name": cluster_name,
                "user": {
                    "exec": {
                        "apiVersion": "client.authentication.k8s.io/v1beta1",
                        "command": "aws",
                        "args": ["eks", "get-token", "--cluster-name", cluster_name, "--region", region],
                    }
                },
            }
        ],
    }


@dataclass(frozen=True)
class ClusterArgs:
    cluster_name: str
    region: str
    config: ClusterConfig
    private_subnet_ids: pulumi.Input[list[str]]
    aws_provider: aws.Provider
    vpc_cidr: str
    protect_logs: bool = False  # the control-plane and audit log group survives `pulumi destroy` (prod)


class Cluster(pulumi.ComponentResource):
    """The EKS cluster, its identity plumbing and node groups, plus a Kubernetes provider for it."""

    name: pulumi.Output[str]
    arn: pulumi.Output[str]
    endpoint: pulumi.Output[str]
    oidc_provider_arn: pulumi.Output[str]
    oidc_issuer: pulumi.Output[str]
    security_group_id: pulumi.Output[str]
    kubeconfig: pulumi.Output[str]

    def __init__(self, name: str, args: ClusterArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpuyard:eks:Cluster", name, None, opts)
        self._name = name
        self._args = args
        self._opts = pulumi.ResourceOptions(parent=self, provider=args.aws_provider)
        key = self._create_secrets_key()
        log_group = self._create_log_group()
        cluster = self._create_control_plane(key, log_group)
        self._create_api_access(cluster)
        oidc = self._create_oidc_provider(cluster)
        self._create_admin_access(cluster)
        addons = self._create_eks_addons(cluster)
        node_role = self._create_node_role()
        self.system_node_group = self._create_system_node_group(cluster, node_role)
        for group in args.config.gpu_node_groups:
            self._create_gpu_node_group(cluster, node_role, group)
        self.name = cluster.name
        self.arn = cluster.arn
        self.endpoint = cluster.endpoint
        self.oidc_provider_arn = oidc.arn
        self.oidc_issuer = cluster.identities[0].oidcs[0].issuer
        self.security_group_id = cluster.vpc_config.cluster_security_group_id
        self.kubeconfig = self._kubeconfig(cluster)
        self.k8s_provider = self._create_kubernetes_provider(addons)
        self.register_outputs(
            {
                "name": self.name,
                "arn": self.arn,
                "endpoint": self.endpoint,
                "oidc_provider_arn": self.oidc_provider_arn,
                "oidc_issuer": self.oidc_issuer,
                "security_group_id": self.security_group_id,
                "kubeconfig": self.kubeconfig,
            }
        )

    def _role(self, name: str, service: str, policies: tuple[str, ...]) -> aws.iam.Role:
        role = aws.iam.Role(
            f"{self._name}-{name}",
            assume_role_policy=json.dumps(service_assume_role_policy(service)),
            opts=self._opts,
        )
        for policy in policies:
            aws.iam.RolePolicyAttachment(
                f"{self._name}-{name}-{policy}", role=role.name, policy_arn=f"{MANAGED}/{policy}", opts=self._opts
            )
        return role

    def _create_secrets_key(self) -> aws.kms.Key:
        key = aws.kms.Key(
            f"{self._name}-secrets",
            description=f"EKS secrets encryption for {self._args.cluster_name}",
            enable_key_rotation=True,
            deletion_window_in_days=7,
            opts=self._opts,
        )
        aws.kms.Alias(
            f"{self._name}-secrets",
            name=f"alias/{self._args.cluster_name}-secrets",
            target_key_id=key.key_id,
            opts=self._opts,
        )
        return key

    def _create_log_group(self) -> aws.cloudwatch.LogGroup:
        """Control-plane and audit logs; protected like the checkpoint bucket where the stack keeps its data."""
        return aws.cloudwatch.LogGroup(
            f"{self._name}-control-plane-logs",
            name=control_plane_log_group(self._args.cluster_name),
            retention_in_days=self._args.config.log_retention_days,
            opts=pulumi.ResourceOptions.merge(self._opts, pulumi.ResourceOptions(protect=self._args.protect_logs)),
        )

    def _create_control_plane(self, key: aws.kms.Key, log_group: aws.cloudwatch.LogGroup) -> aws.eks.Cluster:
        config = self._args.config
        role = self._role("cluster", "eks.amazonaws.com", ("AmazonEKSClusterPolicy",))
        return aws.eks.Cluster(
            f"{self._name}-eks",
            name=self._args.cluster_name,
            version=config.kubernetes_version,
            role_arn=role.arn,
            vpc_config={
                "subnet_ids": self._args.private_subnet_ids,
                "endpoint_private_access": config.endpoint_private,
                "endpoint_public_access": config.endpoint_public,
                "public_access_cidrs": list(config.public_access_cidrs) if config.endpoint_public else None,
            },
            access_config={"authentication_mode": "API", "bootstrap_cluster_creator_admin_permissions": True},
            encryption_config={"resources": ["secrets"], "provider": {"key_arn": key.arn}},
            enabled_cluster_log_types=list(config.log_types),
            upgrade_policy={"support_type": "EXTENDED" if config.allow_extended_support else "STANDARD"},
            opts=pulumi.ResourceOptions.merge(self._opts, pulumi.ResourceOptions(depends_on=[log_group])),
        )

    def _create_api_access(self, cluster: aws.eks.Cluster) -> None:
        """The private endpoint's door: HTTPS from the VPC and from ``private_access_cidrs`` (VPN, peered CI) into the
        cluster security group, so ``pulumi up`` and kubectl work from there when the endpoint is private."""
        if not self._args.config.endpoint_private:
            return
        for index, cidr in enumerate((self._args.vpc_cidr, *self._args.config.private_access_cidrs)):
            aws.vpc.SecurityGroupIngressRule(
                f"{self._name}-api-{index}",
                security_group_id=cluster.vpc_config.cluster_security_group_id,
                cidr_ipv4=cidr,
                ip_protocol="tcp",
                from_port=API_PORT,
                to_port=API_PORT,
                description="Kubernetes API from the VPC" if index == 0 else "Kubernetes API from a deploying network",
                opts=self._opts,
            )

    def _create_oidc_provider(self, cluster: aws.eks.Cluster) -> aws.iam.OpenIdConnectProvider:
        return aws.iam.OpenIdConnectProvider(
            f"{self._name}-oidc",
            url=cluster.identities[0].oidcs[0].issuer,
            client_id_lists=["sts.amazonaws.com"],
            opts=self._opts,
        )

    def _create_admin_access(self, cluster: aws.eks.Cluster) -> None:
        for index, principal in enumerate(self._args.config.admin_role_arns):
            entry = aws.eks.AccessEntry(
                f"{self._name}-admin-{index}",
                cluster_name=cluster.name,
                principal_arn=principal,
                type="STANDARD",
                opts=self._opts,
            )
            aws.eks.AccessPolicyAssociation(
                f"{self._name}-admin-{index}",
                cluster_name=cluster.name,
                principal_arn=entry.principal_arn,
                policy_arn=CLUSTER_ADMIN_POLICY,
                access_scope={"type": "cluster"},
                opts=self._opts,
            )

    def _create_eks_addons(self, cluster: aws.eks.Cluster) -> list[aws.eks.Addon]:
        addons = []
        for addon in EKS_ADDONS:
            configuration = ADDON_CONFIGURATION.get(addon)
            addons.append(aws.eks.Addon(
                f"{self._name}-{addon}", cluster_name=cluster.name, addon_name=addon,
                configuration_values=json.dumps(configuration) if configuration else None,
                resolve_conflicts_on_create=ADDON_CONFLICTS, resolve_conflicts_on_update=ADDON_CONFLICTS,
                opts=self._opts,
            ))
        return addons

    def _create_node_role(self) -> aws.iam.Role:
        return self._role("node", "ec2.amazonaws.com", NODE_POLICIES)

    def _node_group(
        self,
        cluster: aws.eks.Cluster,
        role: aws.iam.Role,
        group: NodeGroupConfig,
        *,
        ami_type: str,
        template: aws.ec2.LaunchTemplate,
        subnet_ids: pulumi.Input[list[str]],
        taints: list[dict[str, str]] | None = None,
    ) -> aws.eks.NodeGroup:
        return aws.eks.NodeGroup(
            f"{self._name}-{group.name}",
            cluster_name=cluster.name,
            node_group_name=group.name,
            node_role_arn=role.arn,
            subnet_ids=subnet_ids,
            instance_types=list(group.instance_types),
            ami_type=ami_type,
            scaling_config={"min_size": group.min_size, "desired_size": group.desired_size, "max_size": group.max_size},
            launch_template={"id": template.id, "version": template.latest_version.apply(str)},
            labels=node_labels(group),
            taints=taints,
            opts=pulumi.ResourceOptions.merge(
                self._opts, pulumi.ResourceOptions(ignore_changes=["scalingConfig.desiredSize"])
            ),
        )

    def _create_system_node_group(self, cluster: aws.eks.Cluster, role: aws.iam.Role) -> aws.eks.NodeGroup:
        group = self._args.config.system_node_group
        template = aws.ec2.LaunchTemplate(
            f"{self._name}-{group.name}", **launch_template_spec(group.disk_gib), opts=self._opts
        )
        return self._node_group(
            cluster, role, group, ami_type=AMI_SYSTEM, template=template, subnet_ids=self._args.private_subnet_ids
        )

    def _create_gpu_node_group(
        self, cluster: aws.eks.Cluster, role: aws.iam.Role, group: GpuNodeGroupConfig
    ) -> aws.eks.NodeGroup:
        security_group = cluster.vpc_config.cluster_security_group_id if group.efa else None
        spec = launch_template_spec(group.disk_gib, security_group, group.efa_interfaces, gpu=True)
        subnet_ids = self._args.private_subnet_ids
        if group.efa:
            placement = aws.ec2.PlacementGroup(f"{self._name}-{group.name}", strategy="cluster", opts=self._opts)
            spec["placement"] = {"group_name": placement.name}
            subnet_ids = pulumi.Output.from_input(subnet_ids).apply(lambda ids: ids[:1])
        template = aws.ec2.LaunchTemplate(f"{self._name}-{group.name}", **spec, opts=self._opts)
        return self._node_group(
            cluster, role, group, ami_type=AMI_GPU, template=template, subnet_ids=subnet_ids, taints=gpu_node_taints()
        )

    def _kubeconfig(self, cluster: aws.eks.Cluster) -> pulumi.Output[str]:
        return pulumi.Output.secret(
            pulumi.Output.all(cluster.name, cluster.endpoint, cluster.certificate_authority.data).apply(
                lambda values: json.dumps(kubeconfig(values[0], values[1], values[2], self._args.region))
            )
        )

    def _create_kubernetes_provider(self, addons: list[aws.eks.Addon]) -> kubernetes.Provider:
        """Every Kubernetes object goes through this provider, so it is created after the system nodes and the EKS
        add-ons and deleted before them: operators, Karpenter and their finalizers still have pod networking
        (vpc-cni, kube-proxy) and DNS (coredns, which Karpenter needs to reach EC2) while they are torn down."""
        return kubernetes.Provider(
            f"{self._name}-k8s",
            kubeconfig=self.kubeconfig,
            enable_server_side_apply=True,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.system_node_group, *addons]),
        )
