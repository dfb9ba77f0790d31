"""gpuyard jobs: job specs, renderers per kind, the reference DDP workload and the CLI."""
