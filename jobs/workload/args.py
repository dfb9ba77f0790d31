"""The trainer's command line, shared by the trainer, the images and the job templates.

``TrainArgs.to_argv()`` is what the templates put in a pod and what the tests run;
``parse_args(argv)`` is how the trainer reads it back, so the two cannot diverge.
"""

from __future__ import annotations

import argparse
import sys
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from infra.validation import validation_message

MODELS = ("linear", "mlp")
TRAIN_MODULE = "jobs.workload.train"
RAY_MODULE = "jobs.workload.ray_entry"
DEFAULT_GRACE_PERIOD = 30.0  # Kubernetes' default terminationGracePeriodSeconds
DEFAULT_LEASE_SECONDS = 60.0


class TrainArgs(BaseModel):
    """Validated trainer arguments (seed-compatible with the PyTorch DDP tutorial)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    total_epochs: Annotated[int, Field(ge=1)]
    save_every: Annotated[int, Field(ge=1)]
    batch_size: Annotated[int, Field(ge=1)] = 32
    checkpoint_uri: str | None = None
    dataset_size: Annotated[int, Field(ge=1)] = 2048
    model: Literal["linear", "mlp"] = "linear"
    seed: int = 0
    lr: Annotated[float, Field(gt=0)] = 1e-3
    metrics_port: Annotated[int, Field(ge=0, le=65535)] | None = None
    save_every_steps: Annotated[int, Field(ge=1)] | None = None
    grace_period: Annotated[float, Field(gt=0)] = DEFAULT_GRACE_PERIOD
    lease_seconds: Annotated[float, Field(gt=0)] = DEFAULT_LEASE_SECONDS

    def to_argv(self) -> list[str]:
        """The command-line form, accepted by ``parse_args``."""
        argv = [str(self.total_epochs), str(self.save_every), "--batch_size", str(self.batch_size)]
        if self.checkpoint_uri:
            argv += ["--checkpoint-uri", self.checkpoint_uri]
        argv += ["--dataset-size", str(self.dataset_size), "--model", self.model]
        argv += ["--seed", str(self.seed), "--lr", repr(self.lr)]
        if self.metrics_port is not None:
            argv += ["--metrics-port", str(self.metrics_port)]
        if self.save_every_steps is not None:
            argv += ["--save-every-steps", str(self.save_every_steps)]
        if self.grace_period != DEFAULT_GRACE_PERIOD:
            argv += ["--grace-period", f"{self.grace_period:g}"]
        if self.lease_seconds != DEFAULT_LEASE_SECONDS:
            argv += ["--lease-seconds", f"{self.lease_seconds:g}"]
        return argv


class ArgsError(ValueError):
    """Bad trainer arguments, as one line."""


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's default prints the whole usage
        raise ArgsError(message)


def build_parser(prog: str = f"python -m {TRAIN_MODULE}") -> argparse.ArgumentParser:
    parser = _OneLineParser(prog=prog, description="gpuyard reference DDP trainer")
    parser.add_argument("total_epochs", type=int, help="total epochs to train")
    parser.add_argument("save_every", type=int, help="save a checkpoint every N epochs")
    parser.add_argument("--batch_size", "--batch-size", type=int, default=32, help="per-rank batch size")
    parser.add_argument("--checkpoint-uri", default=None, help="local path or s3://bucket/prefix")
    parser.add_argument("--dataset-size", type=int, default=2048)
    parser.add_argument("--model", default="linear", help=" | ".join(MODELS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--metrics-port", type=int, default=None, help="Prometheus port on rank 0")
    parser.add_argument("--save-every-steps", type=int, default=None, help="also checkpoint every N global steps")
    parser.add_argument("--grace-period", type=float, default=DEFAULT_GRACE_PERIOD,
                        help="seconds from SIGTERM to SIGKILL (the pod's terminationGracePeriodSeconds)")
    parser.add_argument("--lease-seconds", type=float, default=DEFAULT_LEASE_SECONDS,
                        help="the checkpoint prefix's writer lease expires this long after its last heartbeat")
    return parser


def parse_args(argv: list[str], parser: argparse.ArgumentParser | None = None) -> TrainArgs:
    """Parse and validate; raises ArgsError with one line naming the bad value."""
    namespace = (parser or build_parser()).parse_args(argv)
    try:
        return TrainArgs.model_validate(vars(namespace))
    except ValidationError as error:
        raise ArgsError(validation_message(error)) from None


def exit_on_bad_args(argv: list[str]) -> TrainArgs:
    """parse_args for a ``__main__``: a bad argument prints one line and exits 2."""
    try:
        return parse_args(argv)
    except ArgsError as error:
        print(f"train: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
