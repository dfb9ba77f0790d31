"""``gpuyard demo``: the main job on the embedded default, no cloud account needed.

Each part is one function that prints its own progress and returns what the summary needs;
``demo()`` is the sequence of parts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
import typer

from gpuyard.infra.config import load_stack
from gpuyard.jobs.cli.errors import fail
from gpuyard.jobs.cli.options import checked_output_dir, provenance, stack_option
from gpuyard.jobs.local_aws import LocalAWS
from gpuyard.jobs.processes import stop_tree
from gpuyard.jobs.workload.args import TRAIN_MODULE, TrainArgs

BUCKET = "gpuyard-demo"
PROCESSES = 2
PLAN_TYPES_SHOWN = 10
DEMO_ARGS = TrainArgs(total_epochs=20, save_every=5, batch_size=32, dataset_size=4096,
                      checkpoint_uri=f"s3://{BUCKET}/runs/ddp")

# The demo renders templates of stacks that name no registry yet: a clearly fake one, never Docker Hub.
DEMO_REGISTRY_HOST = "placeholder.invalid"


@dataclass
class TrainingRun:
    """What the training part saw: the trainer's events and the checkpoint objects left in the bucket."""

    args: TrainArgs
    endpoint_url: str
    seconds: float
    done: dict = field(default_factory=dict)
    epochs: list[dict] = field(default_factory=list)
    checkpoints: list[dict] = field(default_factory=list)
    failures: list[dict] = field(default_factory=list)
    objects: list[str] = field(default_factory=list)


def torchrun_command(args: TrainArgs, processes: int = PROCESSES) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes),
            "-m", TRAIN_MODULE, *args.to_argv()]


def run_training(aws: LocalAWS, console: Console, args: TrainArgs = DEMO_ARGS) -> TrainingRun:
    """Create the bucket, train under torchrun on the CPU with a live progress bar, list the checkpoints."""
    s3 = aws.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    started = time.perf_counter()
    with tempfile.TemporaryFile("w+") as launcher_log:
        trainer = subprocess.Popen(torchrun_command(args), stdout=subprocess.PIPE, stderr=launcher_log, text=True,
                                   env={**os.environ, **aws.env, "OMP_NUM_THREADS": "1"}, start_new_session=True)
        try:
            training = _follow(trainer, console, args, aws.endpoint_url)
            trainer.wait()
        finally:  # on Ctrl-C/SIGTERM too: torchrun and its workers (each in a session of its own) stop here
            stop_tree(trainer)
        if trainer.returncode != 0 or not training.done:
            launcher_log.seek(0)
            fail(f"training failed (exit {trainer.returncode}): {root_cause(launcher_log.read())}", 1)
    training.seconds = time.perf_counter() - started
    listing = s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])
    training.objects = [f"s3://{BUCKET}/{item['Key']}" for item in listing]
    return training


def root_cause(launcher_output: str) -> str:
    """The workers' exception line (``[rank0]: RuntimeError: ...``) if any, else torchrun's last error line."""
    lines = launcher_output.splitlines()
    raised = [line for line in lines if line.startswith("[rank") and "Error:" in line]
    errors = raised or [line for line in lines if "error" in line.lower()]
    return errors[-1].strip() if errors else "see torchrun output"


def _follow(trainer: subprocess.Popen, console: Console, args: TrainArgs, endpoint_url: str) -> TrainingRun:
    training = TrainingRun(args, endpoint_url, 0.0)
    columns = (TextColumn("[bold]torchrun x{task.fields[procs]}[/] {task.description}"), BarColumn(),
               MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("starting", total=args.total_epochs, procs=PROCESSES)
        for line in trainer.stdout:
            if not line.startswith("{"):
                continue
            event = json.loads(line)
            kind = event["event"]
            if kind == "epoch":
                training.epochs.append(event)
                progress.update(task, completed=event["epoch"], description=f"loss {event['loss']:.4f}")
            elif kind == "checkpoint":
                training.checkpoints.append(event)
                progress.console.print(f"checkpoint  epoch {event['epoch']:>3} -> {event['uri']} ({event['seconds']:.2f}s)")
            elif kind in ("checkpoint_failed", "checkpoint_skipped", "prune_failed"):
                training.failures.append(event)
                progress.console.print(f"[yellow]{kind}[/] {json.dumps(event)}")
            elif kind == "done":
                training.done = event
    return training


def show_training_summary(console: Console, training: TrainingRun) -> None:
    """One table: epochs, throughput, checkpoints and where they went, final weights."""
    steady = training.epochs[1:] or training.epochs
    table = Table(title="gpuyard demo: distributed training", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    table.add_row("launcher", f"torchrun, {PROCESSES} processes, gloo on CPU")
    table.add_row("epochs", f"{training.done['epochs']} ({training.done['global_step']} optimizer steps)")
    table.add_row("samples/s", f"{sum(e['samples_per_s'] for e in steady) / len(steady):,.0f} (all ranks)")
    table.add_row("final loss", f"{training.epochs[-1]['loss']:.4f}")
    table.add_row("checkpoints written", f"{len(training.checkpoints)} (every {training.args.save_every} epochs, "
                                         f"{len(training.failures)} problems)")
    kept = [uri.rsplit("/", 1)[-1].removesuffix(".pt") for uri in training.objects if uri.endswith(".pt")]
    table.add_row("checkpoints kept", f"{', '.join(kept)} (data .pt + manifest .json each)")
    table.add_row("where", f"{training.args.checkpoint_uri} on local S3 {training.endpoint_url} (moto, now stopped)")
    table.add_row("weights sha256", training.done["weights_sha256"])
    table.add_row("wall time", f"{training.seconds:.1f}s")
    console.print(table)


def demo_registry(cluster_name: str) -> str:
    """A registry that cannot exist (RFC 2606 ``.invalid``), for a stack that names none: the demo's
    templates show where images go without pretending anyone can pull them."""
    return f"{DEMO_REGISTRY_HOST}/{cluster_name}"


def render_templates(console: Console, stack: str, out_dir: Path) -> list[Path]:
    """Render every kind for every team of the stack into ``out_dir`` (all files or none) and list them."""
    from gpuyard.jobs.render import default_specs, manifest_path, render_specs, write_manifests

    config = load_stack(stack)
    title = f"job templates of stack {stack!r} (gpuyard render --stack {stack} --all -d {out_dir})"
    if not config.image_registry:
        config = config.model_copy(update={"image_registry": demo_registry(config.cluster_name)})
        title += f"; images from the placeholder {config.image_registry} (set gpuyard:image_registry)"
    specs = default_specs(config)
    written = write_manifests(render_specs(config, specs), out_dir, provenance(stack))
    table = Table(title=title, title_justify="left")
    table.add_column("team")
    table.add_column("kind")
    table.add_column("file", overflow="fold")
    for spec in specs:
        table.add_row(spec.team, spec.kind, str(out_dir / manifest_path(spec)))
    console.print(table)
    return written


def show_plan_summary(console: Console, stack: str) -> int:
    """What ``pulumi up`` would create for the stack, computed offline under Pulumi's mocks."""
    from gpuyard.infra.plan import plan_summary  # the Pulumi SDKs load only here

    count, per_type = plan_summary(stack)
    table = Table(title=f"pulumi up --stack {stack} would create {count} resources (gpuyard plan, offline)",
                  title_justify="left")
    table.add_column("resource type")
    table.add_column("count", justify="right")
    ranked = sorted(per_type.items(), key=lambda item: (-item[1], item[0]))
    for resource_type, n in ranked[:PLAN_TYPES_SHOWN]:
        table.add_row(resource_type, str(n))
    rest = ranked[PLAN_TYPES_SHOWN:]
    table.add_row(f"… {len(rest)} more types (gpuyard plan --stack {stack})", str(sum(n for _, n in rest)))
    console.print(table)
    return count


def demo(
    stack: str = stack_option("Stack whose templates and plan are shown."),
    output_dir: str = typer.Option("out/demo", "--output-dir", "-d", metavar="DIR",
                                   help="Folder for the rendered templates."),
) -> None:
    """Train the reference DDP workload under torchrun on a local S3 endpoint, then render the
    stack's job templates and show what `pulumi up` would create."""
    console = Console()
    out_dir = checked_output_dir(output_dir)  # before training, not after it
    try:
        config = load_stack(stack)
    except ValueError as error:
        fail(str(error))
    with LocalAWS() as aws:
        training = run_training(aws, console)
    show_training_summary(console, training)
    try:
        render_templates(console, config.stack, out_dir)
    except OSError as error:
        fail(f"--output-dir {output_dir}: cannot write: {error.strerror or error}", 1)
    show_plan_summary(console, config.stack)
