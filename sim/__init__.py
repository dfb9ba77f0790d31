"""``gpuyard sim``: the stack's Kubernetes layer, Volcano and the training operators on simulated GPU nodes."""
