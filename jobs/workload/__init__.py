"""The reference DDP workload: one trainer for torchrun, mpirun, Ray Train and plain python."""
