"""The simulated cluster's AWS endpoint: ``moto_server`` on the real nodes' bridge, holding the stack's checkpoint
bucket; it answers S3 and the STS calls of the pods' IRSA credentials (sim/irsa.py).

It listens on the bridge's own address, which every pod reaches and nothing outside the sim's network namespace
does, on 443: the team namespaces' NetworkPolicies let pods out to TCP 443 only (infra/tenancy.py
allow-https-egress). Plain HTTP: the pods' CA bundle is their image's, and no certificate of ours is in it.
``s3.json`` in the state folder records the endpoint (`gpuyard sim status`: ``s3_endpoint``).
"""

from __future__ import annotations

import json
from pathlib import Path

from gpuyard.infra.config import StackConfig
from gpuyard.jobs.local_aws import CREDENTIALS, LocalAWS, moto_command
from gpuyard.sim.processes import Supervisor

NAME = "moto"  # the supervisor's name for it
PORT = 443
RECORD = "s3.json"
READY_TIMEOUT_SECONDS = 60


def start(supervisor: Supervisor, host: str, config: StackConfig) -> str:
    """moto_server on ``host``:443 under ``supervisor`` with the stack's bucket made; returns its endpoint URL."""
    aws = LocalAWS(PORT, host=host)  # the server is the supervisor's; this only speaks to it
    supervisor.start(NAME, [*moto_command(), "-H", host, "-p", str(PORT)], env=CREDENTIALS)
    supervisor.wait_until(NAME, aws.answers, READY_TIMEOUT_SECONDS, f"moto_server on {aws.endpoint_url}")
    aws.client("s3").create_bucket(Bucket=config.checkpoint_bucket,
                                   CreateBucketConfiguration={"LocationConstraint": config.region})
    (supervisor.state / RECORD).write_text(json.dumps({"endpoint": aws.endpoint_url}) + "\n")
    return aws.endpoint_url


def recorded(state: Path) -> str | None:
    """The endpoint a state folder's ``start`` recorded, if any."""
    path = state / RECORD
    return json.loads(path.read_text())["endpoint"] if path.is_file() else None


def endpoint_of(state: Path) -> LocalAWS | None:
    """The recorded endpoint as a LocalAWS this process did not start (its ``env`` and ``client``: moto's dummy
    credentials, what this machine's tools use; the pods' come from STS, sim/irsa.py)."""
    endpoint = recorded(state)
    if endpoint is None:
        return None
    host, port = endpoint.removeprefix("http://").rsplit(":", 1)
    return LocalAWS(int(port), host=host)
