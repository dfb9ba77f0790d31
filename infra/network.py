"""Network: a VPC over several AZs with public and private subnets and NAT (one, or one per AZ)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from gpuyard.infra.config import ConfigError, NetworkConfig


def subnet_cidrs(cidr: str, az_count: int) -> tuple[list[str], list[str]]:
    """Split the VPC into ``az_count`` small public and large private subnets.

    The first eighth of the range holds the public subnets; eighths 1..az_count are the private ones.
    """
    network = ipaddress.ip_network(cidr)
    eighths = list(network.subnets(prefixlen_diff=3))
    public = [str(net) for net in list(eighths[0].subnets(prefixlen_diff=3))[:az_count]]
    private = [str(net) for net in eighths[1 : az_count + 1]]
    return public, private


def subnet_tags(cluster_name: str, public: bool) -> dict[str, str]:
    """Tags the AWS load balancer controller and Karpenter discover subnets by."""
    tags = {f"kubernetes.io/cluster/{cluster_name}": "shared"}
    if public:
        tags["kubernetes.io/role/elb"] = "1"
    else:
        tags["kubernetes.io/role/internal-elb"] = "1"
        tags["karpenter.sh/discovery"] = cluster_name
    return tags


@dataclass(frozen=True)
class NetworkArgs:
    cluster_name: str
    config: NetworkConfig
    aws_provider: aws.Provider


class Network(pulumi.ComponentResource):
    """VPC, internet gateway, public/private subnets per AZ, NAT gateways and routes."""

    vpc_id: pulumi.Output[str]
    public_subnet_ids: pulumi.Output[list[str]]
    private_subnet_ids: pulumi.Output[list[str]]
    zones: list[str]  # the AZ of each private (and public) subnet, in the same order

    def __init__(self, name: str, args: NetworkArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpuyard:network:Network", name, None, opts)
        self._name = name
        self._args = args
        self._opts = pulumi.ResourceOptions(parent=self, provider=args.aws_provider)
        zones = self._availability_zones()
        vpc = self._create_vpc()
        gateway = self._create_internet_gateway(vpc)
        public = self._create_public_subnets(vpc, gateway, zones)
        nats = self._create_nat_gateways(public)
        private = self._create_private_subnets(vpc, nats, zones)
        self.vpc_id = vpc.id
        self.zones = zones
        self.public_subnet_ids = pulumi.Output.all(*[subnet.id for subnet in public])
        self.private_subnet_ids = pulumi.Output.all(*[subnet.id for subnet in private])
        self.register_outputs(
            {
                "vpc_id": self.vpc_id,
                "public_subnet_ids": self.public_subnet_ids,
                "private_subnet_ids": self.private_subnet_ids,
            }
        )

    def _availability_zones(self) -> list[str]:
        zones = aws.get_availability_zones(
            state="available", opts=pulumi.InvokeOptions(parent=self, provider=self._args.aws_provider)
        ).names
        if len(zones) < self._args.config.az_count:
            raise ConfigError(f"gpuyard:network.az_count is {self._args.config.az_count} but the region has "
                              f"{len(zones)} AZs")
        return list(zones[: self._args.config.az_count])

    def _create_vpc(self) -> aws.ec2.Vpc:
        return aws.ec2.Vpc(
            f"{self._name}-vpc",
            cidr_block=self._args.config.cidr,
            enable_dns_hostnames=True,
            enable_dns_support=True,
            tags={"Name": self._args.cluster_name},
            opts=self._opts,
        )

    def _create_internet_gateway(self, vpc: aws.ec2.Vpc) -> aws.ec2.InternetGateway:
        return aws.ec2.InternetGateway(f"{self._name}-igw", vpc_id=vpc.id, opts=self._opts)

    def _create_public_subnets(
        self, vpc: aws.ec2.Vpc, gateway: aws.ec2.InternetGateway, zones: list[str]
    ) -> list[aws.ec2.Subnet]:
        table = aws.ec2.RouteTable(
            f"{self._name}-public",
            vpc_id=vpc.id,
            routes=[aws.ec2.RouteTableRouteArgs(cidr_block="0.0.0.0/0", gateway_id=gateway.id)],
            opts=self._opts,
        )
        cidrs, _ = subnet_cidrs(self._args.config.cidr, len(zones))
        return [
            self._create_subnet(vpc, table, zone, cidr, public=True)
            for zone, cidr in zip(zones, cidrs)
        ]

    def _create_nat_gateways(self, public: list[aws.ec2.Subnet]) -> list[aws.ec2.NatGateway]:
        hosts = public if self._args.config.nat == "per_az" else public[:1]
        gateways = []
        for index, subnet in enumerate(hosts):
            address = aws.ec2.Eip(f"{self._name}-nat-{index}", domain="vpc", opts=self._opts)
            gateways.append(
                aws.ec2.NatGateway(
                    f"{self._name}-nat-{index}", allocation_id=address.id, subnet_id=subnet.id, opts=self._opts
                )
            )
        return gateways

    def _create_private_subnets(
        self, vpc: aws.ec2.Vpc, nats: list[aws.ec2.NatGateway], zones: list[str]
    ) -> list[aws.ec2.Subnet]:
        _, cidrs = subnet_cidrs(self._args.config.cidr, len(zones))
        subnets = []
        for index, (zone, cidr) in enumerate(zip(zones, cidrs)):
            nat = nats[index % len(nats)]
            table = aws.ec2.RouteTable(
                f"{self._name}-private-{zone}",
                vpc_id=vpc.id,
                routes=[aws.ec2.RouteTableRouteArgs(cidr_block="0.0.0.0/0", nat_gateway_id=nat.id)],
                opts=self._opts,
            )
            subnets.append(self._create_subnet(vpc, table, zone, cidr, public=False))
        return subnets

    def _create_subnet(
        self, vpc: aws.ec2.Vpc, table: aws.ec2.RouteTable, zone: str, cidr: str, *, public: bool
    ) -> aws.ec2.Subnet:
        """One subnet in ``zone``, tagged for the EKS load balancers of its kind and routed through ``table``."""
        kind = "public" if public else "private"
        subnet = aws.ec2.Subnet(
            f"{self._name}-{kind}-{zone}",
            vpc_id=vpc.id,
            cidr_block=cidr,
            availability_zone=zone,
            tags={"Name": f"{self._args.cluster_name}-{kind}-{zone}", **subnet_tags(self._args.cluster_name, public)},
            map_public_ip_on_launch=False if public else None,  # public subnets host load balancers, never nodes
            opts=self._opts,
        )
        aws.ec2.RouteTableAssociation(
            f"{self._name}-{kind}-{zone}", subnet_id=subnet.id, route_table_id=table.id, opts=self._opts
        )
        return subnet
