"""Prometheus metrics of the training loop, served by rank 0 on ``--metrics-port``."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


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
        start_http_server(port, registry=self.registry)

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
