"""``gpuyard demo``: the main job on the embedded default, no cloud account needed."""

from jobs.cli.main import app


@app.command()
def demo() -> None:
    """Train the reference DDP workload under torchrun on a local S3 endpoint."""
    raise NotImplementedError("filled in by the trainer work")
