"""gpuyard infrastructure: the Pulumi program and its typed configuration."""
