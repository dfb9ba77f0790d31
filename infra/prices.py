"""On-demand prices (USD per instance-hour) of the instance types gpuyard's stacks may run.

The table Karpenter's AWS provider starts from (aws/karpenter-provider-aws v1.14.1,
pkg/providers/pricing/zz_generated.pricing_aws.go, ``InitialOnDemandPricesAWS["us-east-1"]``, generated
2026-07-06), for every size (metal left out) of the families ``gpuyard.infra.config`` knows. It is the only region that
table holds, so every stack is priced at us-east-1's list price. Spot prices are not here: on a cluster they come
from Karpenter (its ``karpenter_cloudprovider_instance_type_offering_price_estimate`` gauge, infra/showback.py).
p5e has no public on-demand price (capacity blocks only) and is absent.
"""

from __future__ import annotations

ON_DEMAND_USD_PER_HOUR: dict[str, float] = {
    "c6i.large": 0.085, "c6i.xlarge": 0.17, "c6i.2xlarge": 0.34, "c6i.4xlarge": 0.68, "c6i.8xlarge": 1.36,
    "c6i.12xlarge": 2.04, "c6i.16xlarge": 2.72, "c6i.24xlarge": 4.08, "c6i.32xlarge": 5.44,
    "c7i.large": 0.08925, "c7i.xlarge": 0.1785, "c7i.2xlarge": 0.357, "c7i.4xlarge": 0.714, "c7i.8xlarge": 1.428,
    "c7i.12xlarge": 2.142, "c7i.16xlarge": 2.856, "c7i.24xlarge": 4.284, "c7i.48xlarge": 8.568,
    "g4dn.xlarge": 0.526, "g4dn.2xlarge": 0.752, "g4dn.4xlarge": 1.204, "g4dn.8xlarge": 2.176,
    "g4dn.12xlarge": 3.912, "g4dn.16xlarge": 4.352,
    "g5.xlarge": 1.006, "g5.2xlarge": 1.212, "g5.4xlarge": 1.624, "g5.8xlarge": 2.448, "g5.12xlarge": 5.672,
    "g5.16xlarge": 4.096, "g5.24xlarge": 8.144, "g5.48xlarge": 16.288,
    "g6.xlarge": 0.8048, "g6.2xlarge": 0.9776, "g6.4xlarge": 1.3232, "g6.8xlarge": 2.0144, "g6.12xlarge": 4.6016,
    "g6.16xlarge": 3.3968, "g6.24xlarge": 6.6752, "g6.48xlarge": 13.3504,
    "g6e.xlarge": 1.861, "g6e.2xlarge": 2.24208, "g6e.4xlarge": 3.00424, "g6e.8xlarge": 4.52856,
    "g6e.12xlarge": 10.49264, "g6e.16xlarge": 7.57719, "g6e.24xlarge": 15.06559, "g6e.48xlarge": 30.13118,
    "gr6.4xlarge": 1.5392, "gr6.8xlarge": 2.4464,
    "m5.large": 0.096, "m5.xlarge": 0.192, "m5.2xlarge": 0.384, "m5.4xlarge": 0.768, "m5.8xlarge": 1.536,
    "m5.12xlarge": 2.304, "m5.16xlarge": 3.072, "m5.24xlarge": 4.608,
    "m6a.large": 0.0864, "m6a.xlarge": 0.1728, "m6a.2xlarge": 0.3456, "m6a.4xlarge": 0.6912, "m6a.8xlarge": 1.3824,
    "m6a.12xlarge": 2.0736, "m6a.16xlarge": 2.7648, "m6a.24xlarge": 4.1472, "m6a.32xlarge": 5.5296,
    "m6a.48xlarge": 8.2944,
    "m6i.large": 0.096, "m6i.xlarge": 0.192, "m6i.2xlarge": 0.384, "m6i.4xlarge": 0.768, "m6i.8xlarge": 1.536,
    "m6i.12xlarge": 2.304, "m6i.16xlarge": 3.072, "m6i.24xlarge": 4.608, "m6i.32xlarge": 6.144,
    "m7a.medium": 0.05796, "m7a.large": 0.11592, "m7a.xlarge": 0.23184, "m7a.2xlarge": 0.46368,
    "m7a.4xlarge": 0.92736, "m7a.8xlarge": 1.85472, "m7a.12xlarge": 2.78208, "m7a.16xlarge": 3.70944,
    "m7a.24xlarge": 5.56416, "m7a.32xlarge": 7.41888, "m7a.48xlarge": 11.12832,
    "m7i.large": 0.1008, "m7i.xlarge": 0.2016, "m7i.2xlarge": 0.4032, "m7i.4xlarge": 0.8064, "m7i.8xlarge": 1.6128,
    "m7i.12xlarge": 2.4192, "m7i.16xlarge": 3.2256, "m7i.24xlarge": 4.8384, "m7i.48xlarge": 9.6768,
    "p3.2xlarge": 3.06, "p3.8xlarge": 12.24, "p3.16xlarge": 24.48,
    "p3dn.24xlarge": 31.212,
    "p4d.24xlarge": 21.957642,
    "p4de.24xlarge": 27.44705,
    "p5.4xlarge": 6.88, "p5.48xlarge": 55.04,
    "p5en.48xlarge": 63.296,
    "p6-b200.48xlarge": 113.9328,
    "r6i.large": 0.126, "r6i.xlarge": 0.252, "r6i.2xlarge": 0.504, "r6i.4xlarge": 1.008, "r6i.8xlarge": 2.016,
    "r6i.12xlarge": 3.024, "r6i.16xlarge": 4.032, "r6i.24xlarge": 6.048, "r6i.32xlarge": 8.064,
    "r7i.large": 0.1323, "r7i.xlarge": 0.2646, "r7i.2xlarge": 0.5292, "r7i.4xlarge": 1.0584, "r7i.8xlarge": 2.1168,
    "r7i.12xlarge": 3.1752, "r7i.16xlarge": 4.2336, "r7i.24xlarge": 6.3504, "r7i.48xlarge": 12.7008,
    "t3.nano": 0.0052, "t3.micro": 0.0104, "t3.small": 0.0208, "t3.medium": 0.0416, "t3.large": 0.0832,
    "t3.xlarge": 0.1664, "t3.2xlarge": 0.3328,
}


def on_demand_price(instance_type: str) -> float | None:
    """USD per hour of ``instance_type`` on demand; None where the table has no price."""
    return ON_DEMAND_USD_PER_HOUR.get(instance_type)
