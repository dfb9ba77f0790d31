"""Prometheus metrics of the training loop, served by rank 0 on ``--metrics-port``."""

from __future__ import annotations

import errno
import socket
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

METRICS_ADDRESS = "0.0.0.0"  # start_http_server's default


class PortInUse(ValueError):
    """``--metrics-port`` cannot be served here, as one line."""


def check_port(port: int) -> None:
    """Raise PortInUse unless ``port`` can be bound as ``TrainMetrics.serve`` binds it (checked before training)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as http.server.HTTPServer does
        try:
            probe.bind((METRICS_ADDRESS, port))
        except OSError as error:
            reason = "in use" if error.errno == errno.EADDRINUSE else (error.strerror or str(error))
            raise PortInUse(f"--metrics-port {port}: {reason} on this machine") from None


class TrainMetrics:
    """Samples/s, step time, loss, epoch, checkpoint save seconds and failures, fed by trainer events."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.samples_per_second = Gauge("gpuyard_train_samples_per_second", "Samples/s over the last epoch, all ranks",
                                        registry=self.registry)
        self.step_seconds = Histogram("gpuyard_train_step_seconds", "Time of one optimizer step",
                                      buckets=(0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5), registry=self.registry)
        self.loss = Gauge("gpuyard_train_loss", "Mean loss of the last epoch on rank 0", registry=self.registry)
        self.epoch = Gauge("gpuyard_train_epoch", "Epochs completed", registry=self.registry)
        self.save_seconds = Histogram("gpuyard_checkpoint_save_seconds", "Time to write one checkpoint",
                                      registry=self.registry)
        self.save_failures = Counter("gpuyard_checkpoint_save_failures", "Checkpoints that could not be written",
                                     registry=self.registry)

    def serve(self, port: int) -> None:
        """Serve on every address of the process's network namespace (prometheus_client's default, 0.0.0.0).

        In a pod that namespace is the pod's own: loopback and the pod IP, which the PodMonitor scrapes and the
        team's NetworkPolicy opens to the monitoring namespace only; team namespaces refuse ``hostNetwork``
        (infra/tenancy.py). Binding the pod IP instead would close only loopback, which only the pod's own
        containers reach, and they share the pod IP: nothing would change, so the default stays. Outside a pod (a
        workstation) 0.0.0.0 is every interface of the host: give ``--metrics-port`` there only on a trusted network.
        """
        start_http_server(port, addr=METRICS_ADDRESS, registry=self.registry)

    def record(self, event: dict[str, Any]) -> None:
        kind = event["event"]
        if kind == "epoch":
            self.epoch.set(event["epoch"])
            self.loss.set(event["loss"])
            self.samples_per_second.set(event["samples_per_s"])
        elif kind == "checkpoint":
            self.save_seconds.observe(event["seconds"])
        elif kind == "checkpoint_failed":
            self.save_failures.inc()
