"""AWS commercial regions (aws partition), so a typo in ``aws:region`` fails before Pulumi runs.

Source: the ``aws`` partition's regions in botocore 1.44.8 ``botocore/data/endpoints.json`` and
https://docs.aws.amazon.com/global-infrastructure/latest/regions/aws-regions.html (2025).
"""

COMMERCIAL_REGIONS = frozenset({
    "af-south-1",
    "ap-east-1", "ap-east-2", "ap-northeast-1", "ap-northeast-2", "ap-northeast-3",
    "ap-south-1", "ap-south-2",
    "ap-southeast-1", "ap-southeast-2", "ap-southeast-3", "ap-southeast-4", "ap-southeast-5",
    "ap-southeast-6", "ap-southeast-7",
    "ca-central-1", "ca-west-1",
    "eu-central-1", "eu-central-2", "eu-north-1", "eu-south-1", "eu-south-2", "eu-west-1", "eu-west-2", "eu-west-3",
    "il-central-1", "me-central-1", "me-south-1", "mx-central-1", "sa-east-1",
    "us-east-1", "us-east-2", "us-west-1", "us-west-2",
})
