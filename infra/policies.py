"""IAM and resource policies as pure functions of plain values (JSON-ready dicts).

Components feed them resolved outputs through ``Output.all(...).apply``; tests call them directly.
"""

from __future__ import annotations

VERSION = "2012-10-17"


def service_assume_role_policy(service: str) -> dict:
    """Trust policy letting an AWS service (``eks.amazonaws.com``, ``ec2.amazonaws.com``) assume a role."""
    return {
        "Version": VERSION,
        "Statement": [{"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"}],
    }


def oidc_host(issuer_url: str) -> str:
    """The OIDC issuer without its scheme, as IAM condition keys spell it."""
    return issuer_url.removeprefix("https://")


def irsa_assume_role_policy(oidc_provider_arn: str, issuer_url: str, namespace: str, service_account: str) -> dict:
    """Trust policy for IRSA: only ``system:serviceaccount:<namespace>:<service_account>`` may assume the role."""
    host = oidc_host(issuer_url)
    return {
        "Version": VERSION,
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Federated": oidc_provider_arn},
                "Action": "sts:AssumeRoleWithWebIdentity",
                "Condition": {
                    "StringEquals": {
                        f"{host}:sub": f"system:serviceaccount:{namespace}:{service_account}",
                        f"{host}:aud": "sts.amazonaws.com",
                    }
                },
            }
        ],
    }


def team_checkpoint_policy(bucket_arn: str, prefix: str, data_prefix: str) -> dict:
    """Read/write objects under ``<bucket>/<prefix>*``, read those under ``<bucket>/<data_prefix>*``, and list only
    those prefixes; both end with ``/``, so ``teams/nlp/`` never matches ``teams/nlp-2/...`` (``s3:prefix`` and
    object ARNs compare characters, not path segments: IAM User Guide, "Amazon S3 condition keys", s3:prefix)."""
    return {
        "Version": VERSION,
        "Statement": [
            {
                "Sid": "TeamObjects",
                "Effect": "Allow",
                "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
                "Resource": f"{bucket_arn}/{prefix}*",
            },
            {
                "Sid": "TeamListing",
                "Effect": "Allow",
                "Action": "s3:ListBucket",
                "Resource": bucket_arn,
                "Condition": {"StringLike": {"s3:prefix": [f"{prefix}*", prefix]}},
            },
            {
                "Sid": "TeamDataObjects",
                "Effect": "Allow",
                "Action": "s3:GetObject",
                "Resource": f"{bucket_arn}/{data_prefix}*",
            },
            {
                "Sid": "TeamDataListing",
                "Effect": "Allow",
                "Action": "s3:ListBucket",
                "Resource": bucket_arn,
                "Condition": {"StringLike": {"s3:prefix": [f"{data_prefix}*", data_prefix]}},
            },
        ],
    }


def bucket_tls_only_policy(bucket_arn: str) -> dict:
    """Deny every request to the bucket or its objects that does not use TLS."""
    return {
        "Version": VERSION,
        "Statement": [
            {
                "Sid": "DenyInsecureTransport",
                "Effect": "Deny",
                "Principal": "*",
                "Action": "s3:*",
                "Resource": [bucket_arn, f"{bucket_arn}/*"],
                "Condition": {"Bool": {"aws:SecureTransport": "false"}},
            }
        ],
    }


def interruption_queue_policy(queue_arn: str) -> dict:
    """Let EventBridge (and SQS itself) deliver interruption events to Karpenter's queue."""
    return {
        "Version": VERSION,
        "Statement": [
            {
                "Sid": "EventBridgeWrite",
                "Effect": "Allow",
                "Principal": {"Service": ["events.amazonaws.com", "sqs.amazonaws.com"]},
                "Action": "sqs:SendMessage",
                "Resource": queue_arn,
            },
            {
                "Sid": "DenyHTTP",
                "Effect": "Deny",
                "Principal": "*",
                "Action": "sqs:*",
                "Resource": queue_arn,
                "Condition": {"Bool": {"aws:SecureTransport": "false"}},
            },
        ],
    }


def karpenter_controller_policy(
    cluster_name: str, cluster_arn: str, queue_arn: str, node_role_arn: str, region: str
) -> dict:
    """Karpenter v1.14.1's own controller policy: create only what carries the cluster's and a NodePool's tags,
    touch only what carries them already.

    Statement for statement the policies of aws/karpenter-provider-aws v1.14.1,
    ``website/content/en/docs/getting-started/getting-started-with-karpenter/cloudformation.yaml``
    (NodeLifecycle, IAMIntegration, EKSIntegration, Interruption, ZonalShift, ResourceDiscovery); partition and account
    come from the cluster's ARN.
    """
    partition, account = cluster_arn.split(":")[1], cluster_arn.split(":")[4]
    ec2 = f"arn:{partition}:ec2:{region}"
    profiles = f"arn:{partition}:iam::{account}:instance-profile/*"
    created = [f"{ec2}:*:{kind}/*" for kind in
               ("fleet", "instance", "volume", "network-interface", "launch-template", "spot-instances-request")]
    owned_key = f"kubernetes.io/cluster/{cluster_name}"
    request_tags = {f"aws:RequestTag/{owned_key}": "owned", "aws:RequestTag/eks:eks-cluster-name": cluster_name}
    nodepool_requested = {"aws:RequestTag/karpenter.sh/nodepool": "*"}
    owned_nodepool = {
        "StringEquals": {f"aws:ResourceTag/{owned_key}": "owned"},
        "StringLike": {"aws:ResourceTag/karpenter.sh/nodepool": "*"},
    }
    profile_owned = {f"aws:ResourceTag/{owned_key}": "owned", "aws:ResourceTag/topology.kubernetes.io/region": region}
    profile_requested = {**request_tags, "aws:RequestTag/topology.kubernetes.io/region": region}
    return {
        "Version": VERSION,
        "Statement": [
            {
                "Sid": "AllowScopedEC2InstanceAccessActions",
                "Effect": "Allow",
                "Resource": [
                    f"arn:{partition}:ec2:{region}::image/*",
                    f"arn:{partition}:ec2:{region}::snapshot/*",
                    *(f"{ec2}:*:{kind}/*" for kind in
                      ("security-group", "subnet", "capacity-reservation", "placement-group")),
                ],
                "Action": ["ec2:RunInstances", "ec2:CreateFleet"],
            },
            {
                "Sid": "AllowScopedEC2LaunchTemplateAccessActions",
                "Effect": "Allow",
                "Resource": f"{ec2}:*:launch-template/*",
                "Action": ["ec2:RunInstances", "ec2:CreateFleet"],
                "Condition": owned_nodepool,
            },
            {
                "Sid": "AllowScopedEC2InstanceActionsWithTags",
                "Effect": "Allow",
                "Resource": created,
                "Action": ["ec2:RunInstances", "ec2:CreateFleet", "ec2:CreateLaunchTemplate"],
                "Condition": {"StringEquals": request_tags, "StringLike": nodepool_requested},
            },
            {
                "Sid": "AllowScopedResourceCreationTagging",
                "Effect": "Allow",
                "Resource": created,
                "Action": "ec2:CreateTags",
                "Condition": {
                    "StringEquals": {
                        **request_tags,
                        "ec2:CreateAction": ["RunInstances", "CreateFleet", "CreateLaunchTemplate"],
                    },
                    "StringLike": nodepool_requested,
                },
            },
            {
                "Sid": "AllowScopedResourceTagging",
                "Effect": "Allow",
                "Resource": f"{ec2}:*:instance/*",
                "Action": "ec2:CreateTags",
                "Condition": {
                    **owned_nodepool,
                    "StringEqualsIfExists": {"aws:RequestTag/eks:eks-cluster-name": cluster_name},
                    "ForAllValues:StringEquals": {
                        "aws:TagKeys": ["eks:eks-cluster-name", "karpenter.sh/nodeclaim", "Name"]
                    },
                },
            },
            {
                "Sid": "AllowScopedDeletion",
                "Effect": "Allow",
                "Resource": [f"{ec2}:*:instance/*", f"{ec2}:*:launch-template/*"],
                "Action": ["ec2:TerminateInstances", "ec2:DeleteLaunchTemplate"],
                "Condition": owned_nodepool,
            },
            {
                "Sid": "AllowPassingInstanceRole",
                "Effect": "Allow",
                "Resource": node_role_arn,
                "Action": "iam:PassRole",
                "Condition": {"StringEquals": {"iam:PassedToService": ["ec2.amazonaws.com", "ec2.amazonaws.com.cn"]}},
            },
            {
                "Sid": "AllowScopedInstanceProfileCreationActions",
                "Effect": "Allow",
                "Resource": profiles,
                "Action": ["iam:CreateInstanceProfile"],
                "Condition": {
                    "StringEquals": profile_requested,
                    "StringLike": {"aws:RequestTag/karpenter.k8s.aws/ec2nodeclass": "*"},
                },
            },
            {
                "Sid": "AllowScopedInstanceProfileTagActions",
                "Effect": "Allow",
                "Resource": profiles,
                "Action": ["iam:TagInstanceProfile"],
                "Condition": {
                    "StringEquals": {**profile_owned, **profile_requested},
                    "StringLike": {
                        "aws:ResourceTag/karpenter.k8s.aws/ec2nodeclass": "*",
                        "aws:RequestTag/karpenter.k8s.aws/ec2nodeclass": "*",
                    },
                },
            },
            {
                "Sid": "AllowScopedInstanceProfileActions",
                "Effect": "Allow",
                "Resource": profiles,
                "Action": [
                    "iam:AddRoleToInstanceProfile", "iam:RemoveRoleFromInstanceProfile", "iam:DeleteInstanceProfile"
                ],
                "Condition": {
                    "StringEquals": profile_owned,
                    "StringLike": {"aws:ResourceTag/karpenter.k8s.aws/ec2nodeclass": "*"},
                },
            },
            {"Sid": "AllowAPIServerEndpointDiscovery", "Effect": "Allow", "Resource": cluster_arn,
             "Action": "eks:DescribeCluster"},
            {
                "Sid": "AllowInterruptionQueueActions",
                "Effect": "Allow",
                "Resource": queue_arn,
                "Action": ["sqs:DeleteMessage", "sqs:GetQueueUrl", "sqs:ReceiveMessage"],
            },
            {
                "Sid": "AllowZonalShiftStatusReadOnly",
                "Effect": "Allow",
                "Resource": "*",
                "Action": ["arc-zonal-shift:GetManagedResource"],
                "Condition": {"StringEquals": {"arc-zonal-shift:ResourceIdentifier": cluster_arn}},
            },
            {
                "Sid": "AllowRegionalReadActions",
                "Effect": "Allow",
                "Resource": "*",
                "Action": [
                    "ec2:DescribeCapacityReservations",
                    "ec2:DescribeImages",
                    "ec2:DescribeInstances",
                    "ec2:DescribeInstanceStatus",
                    "ec2:DescribeInstanceTypeOfferings",
                    "ec2:DescribeInstanceTypes",
                    "ec2:DescribeLaunchTemplates",
                    "ec2:DescribePlacementGroups",
                    "ec2:DescribeSecurityGroups",
                    "ec2:DescribeSpotPriceHistory",
                    "ec2:DescribeSubnets",
                ],
                "Condition": {"StringEquals": {"aws:RequestedRegion": region}},
            },
            {
                "Sid": "AllowSSMReadActions",
                "Effect": "Allow",
                "Resource": f"arn:{partition}:ssm:{region}::parameter/aws/service/*",
                "Action": "ssm:GetParameter",
            },
            {"Sid": "AllowPricingReadActions", "Effect": "Allow", "Resource": "*", "Action": "pricing:GetProducts"},
            {"Sid": "AllowUnscopedInstanceProfileListAction", "Effect": "Allow", "Resource": "*",
             "Action": "iam:ListInstanceProfiles"},
            {"Sid": "AllowInstanceProfileReadActions", "Effect": "Allow", "Resource": profiles,
             "Action": "iam:GetInstanceProfile"},
        ],
    }
