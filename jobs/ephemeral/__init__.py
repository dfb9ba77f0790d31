"""Ephemeral environments: stacks with a lease, complete teardown, reaping."""
