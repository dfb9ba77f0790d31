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


def team_checkpoint_policy(bucket_arn: str, prefix: str) -> dict:
    """Read/write objects under ``<bucket>/<prefix>/*`` and list only that prefix."""
    prefix = prefix.strip("/")
    return {
        "Version": VERSION,
        "Statement": [
            {
                "Sid": "TeamObjects",
                "Effect": "Allow",
                "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
                "Resource": f"{bucket_arn}/{prefix}/*",
            },
            {
                "Sid": "TeamListing",
                "Effect": "Allow",
                "Action": "s3:ListBucket",
                "Resource": bucket_arn,
                "Condition": {"StringLike": {"s3:prefix": [f"{prefix}/*", prefix]}},
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
    """What the Karpenter controller may do: launch and terminate tagged instances, read pricing and the queue."""
    owned = {"StringEquals": {f"aws:ResourceTag/kubernetes.io/cluster/{cluster_name}": "owned"}}
    in_region = {"StringEquals": {"aws:RequestedRegion": region}}
    return {
        "Version": VERSION,
        "Statement": [
            {
                "Sid": "Provision",
                "Effect": "Allow",
                "Action": ["ec2:RunInstances", "ec2:CreateFleet", "ec2:CreateLaunchTemplate", "ec2:CreateTags"],
                "Resource": "*",
                "Condition": in_region,
            },
            {
                "Sid": "Terminate",
                "Effect": "Allow",
                "Action": ["ec2:TerminateInstances", "ec2:DeleteLaunchTemplate"],
                "Resource": "*",
                "Condition": owned,
            },
            {
                "Sid": "Describe",
                "Effect": "Allow",
                "Action": [
                    "ec2:DescribeAvailabilityZones",
                    "ec2:DescribeCapacityReservations",
                    "ec2:DescribeImages",
                    "ec2:DescribeInstances",
                    "ec2:DescribeInstanceTypeOfferings",
                    "ec2:DescribeInstanceTypes",
                    "ec2:DescribeLaunchTemplates",
                    "ec2:DescribePlacementGroups",
                    "ec2:DescribeSecurityGroups",
                    "ec2:DescribeSpotPriceHistory",
                    "ec2:DescribeSubnets",
                    "iam:ListInstanceProfiles",
                    "pricing:GetProducts",
                ],
                "Resource": "*",
            },
            {
                "Sid": "AmiParameters",
                "Effect": "Allow",
                "Action": "ssm:GetParameter",
                "Resource": f"arn:aws:ssm:{region}::parameter/aws/service/*",
            },
            {
                "Sid": "Interruption",
                "Effect": "Allow",
                "Action": ["sqs:DeleteMessage", "sqs:GetQueueUrl", "sqs:ReceiveMessage"],
                "Resource": queue_arn,
            },
            {
                "Sid": "PassNodeRole",
                "Effect": "Allow",
                "Action": "iam:PassRole",
                "Resource": node_role_arn,
                "Condition": {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}},
            },
            {
                "Sid": "InstanceProfiles",
                "Effect": "Allow",
                "Action": [
                    "iam:AddRoleToInstanceProfile",
                    "iam:CreateInstanceProfile",
                    "iam:DeleteInstanceProfile",
                    "iam:GetInstanceProfile",
                    "iam:RemoveRoleFromInstanceProfile",
                    "iam:TagInstanceProfile",
                ],
                "Resource": "*",
            },
            {"Sid": "Cluster", "Effect": "Allow", "Action": "eks:DescribeCluster", "Resource": cluster_arn},
        ],
    }
