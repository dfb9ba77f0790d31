"""The trainer's command line, shared by the trainer, the images and the job templates.

``TrainArgs.to_argv()`` is what the templates put in a pod and what the tests run;
``parse_args(argv)`` is how the trainer reads it back, so the two cannot diverge.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpuyard.infra.validation import one_line, validation_message

MODELS = ("linear", "mlp")
TRAIN_MODULE = "gpuyard.jobs.workload.train"
RAY_MODULE = "gpuyard.jobs.workload.ray_entry"
TORCHRUN_MODULE = "gpuyard.jobs.workload.torchrun"  # torchrun whose exit status is its workers'
LAUNCH_MODULE = "gpuyard.jobs.workload.launch"  # mpirun under supervision (exit status, SIGTERM, bounded retries)
RAY_STOP_MODULE = "gpuyard.jobs.workload.ray_stop"  # a Ray pod's preStop hook
DEFAULT_GRACE_PERIOD = 30.0  # Kubernetes' default terminationGracePeriodSeconds
DEFAULT_LEASE_SECONDS = 60.0
# Bounds that keep every value usable to the end of a run: the synthetic dataset takes 84 bytes a sample on every
# rank; torch seeds are below 2**64 and the sampler seeds each epoch with seed + epoch; thread waits (the lease's
# heartbeat, the grace budget) refuse timeouts beyond threading.TIMEOUT_MAX, and a day is beyond any pod's grace.
MAX_EPOCHS = 1_000_000
MAX_SAMPLES = 10_000_000
MAX_SEED = 2**63 - 1
MAX_SECONDS = 86_400.0
Seconds = Annotated[float, Field(gt=0, le=MAX_SECONDS, allow_inf_nan=False)]


class TrainArgs(BaseModel):
    """Validated trainer arguments (seed-compatible with the PyTorch DDP tutorial)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    total_epochs: Annotated[int, Field(ge=1, le=MAX_EPOCHS)]
    save_every: Annotated[int, Field(ge=1, le=MAX_EPOCHS)]
    batch_size: Annotated[int, Field(ge=1, le=MAX_SAMPLES)] = 32
    checkpoint_uri: str | None = None
    dataset_size: Annotated[int, Field(ge=1, le=MAX_SAMPLES)] = 2048
    model: Literal["linear", "mlp"] = "linear"
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)] = 0
    lr: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 1e-3
    metrics_port: Annotated[int, Field(ge=1, le=65535)] | None = None
    save_every_steps: Annotated[int, Field(ge=1, le=MAX_EPOCHS * MAX_SAMPLES)] | None = None
    grace_period: Seconds = DEFAULT_GRACE_PERIOD
    lease_seconds: Annotated[float, Field(ge=1, le=MAX_SECONDS, allow_inf_nan=False)] = DEFAULT_LEASE_SECONDS
    dropout: Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)] = 0.0
    checkpoint_format: Literal["one", "sharded"] = "one"
    parallel: Literal["ddp", "fsdp"] = "ddp"

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
        if self.dropout:
            argv += ["--dropout", repr(self.dropout)]
        if self.checkpoint_format != "one":
            argv += ["--checkpoint-format", self.checkpoint_format]
        if self.parallel != "ddp":
            argv += ["--parallel", self.parallel]
        return argv


class ArgsError(ValueError):
    """Bad trainer arguments, as one line."""


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's default prints the whole usage
        raise ArgsError(one_line(message))


def whole_number(text: str) -> int:
    """An argparse type: ASCII digits, optionally signed (``1_0``, ``3.0`` and ``٣`` are typos, not numbers)."""
    if not re.fullmatch(r"[-+]?[0-9]{1,30}", text):
        raise argparse.ArgumentTypeError(f"{_shown(text)} is not a whole number")
    return int(text)


def decimal(text: str) -> float:
    """An argparse type: a finite decimal number (``nan``, ``inf`` and ``1_0`` are refused here, not at step 2)."""
    if not re.fullmatch(r"[-+]?([0-9]{1,30}(\.[0-9]{0,30})?|\.[0-9]{1,30})([eE][-+]?[0-9]{1,3})?", text):
        raise argparse.ArgumentTypeError(f"{_shown(text)} is not a number (like 30, 0.5 or 1e-3)")
    return float(text)


def _shown(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:40] + "...")


def build_parser(prog: str = f"python -m {TRAIN_MODULE}") -> argparse.ArgumentParser:
    parser = _OneLineParser(prog=prog, description="gpuyard reference DDP trainer")
    parser.add_argument("total_epochs", type=whole_number, metavar="TOTAL_EPOCHS", help="total epochs to train")
    parser.add_argument("save_every", type=whole_number, metavar="SAVE_EVERY", help="save a checkpoint every N epochs")
    parser.add_argument("--batch_size", "--batch-size", type=whole_number, default=32, help="per-rank batch size")
    parser.add_argument("--checkpoint-uri", default=None, help="local path or s3://bucket/prefix")
    parser.add_argument("--dataset-size", type=whole_number, default=2048)
    parser.add_argument("--model", default="linear", help=" | ".join(MODELS))
    parser.add_argument("--seed", type=whole_number, default=0)
    parser.add_argument("--lr", type=decimal, default=1e-3)
    parser.add_argument("--metrics-port", type=whole_number, default=None, help="Prometheus port on rank 0")
    parser.add_argument("--save-every-steps", type=whole_number, default=None,
                        help="also checkpoint every N global steps")
    parser.add_argument("--grace-period", type=decimal, default=DEFAULT_GRACE_PERIOD,
                        help="seconds from SIGTERM to SIGKILL (the pod's terminationGracePeriodSeconds)")
    parser.add_argument("--lease-seconds", type=decimal, default=DEFAULT_LEASE_SECONDS,
                        help="the checkpoint prefix's writer lease expires this long after its last heartbeat")
    parser.add_argument("--dropout", type=float, default=0.0, help="mlp dropout (each rank draws its own masks)")
    parser.add_argument("--checkpoint-format", default="one",
                        help="one (one object written by rank 0) | sharded (every rank writes its part, DCP)")
    parser.add_argument("--parallel", default="ddp",
                        help="ddp | fsdp (FSDP2 fully_shard; checkpoints are always sharded)")
    return parser


def spelled(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Each argument as the user writes it: ``TOTAL_EPOCHS``, ``--batch_size``, ``--lr``."""
    return {action.dest: action.option_strings[0] if action.option_strings else action.metavar
            for action in parser._actions}


def parse_args(argv: list[str], parser: argparse.ArgumentParser | None = None) -> TrainArgs:
    """Parse and validate; raises ArgsError with one line naming the bad value as the user wrote it."""
    parser = parser or build_parser()
    namespace = parser.parse_args(argv)
    names = spelled(parser)
    try:
        return TrainArgs.model_validate(vars(namespace))
    except ValidationError as error:
        where = lambda loc: names.get(str(loc[0]), str(loc[0])) if loc else ""  # noqa: E731
        raise ArgsError(validation_message(error, where=where)) from None


def exit_on_bad_args(argv: list[str]) -> TrainArgs:
    """parse_args for a ``__main__``: a bad argument prints one line and exits 2."""
    try:
        return parse_args(argv)
    except ArgsError as error:
        print(f"train: error: {one_line(error)}", file=sys.stderr)
        raise SystemExit(2) from None
