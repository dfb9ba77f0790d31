"""What rank 0 tells the user: a rich progress bar on a terminal, JSON lines otherwise."""

from __future__ import annotations

import json
import sys
import threading
from typing import Any, TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

Event = dict[str, Any]
WARNINGS = {"checkpoint_skipped", "checkpoint_failed", "prune_failed", "grace_warning", "lease_lost", "nonfinite"}


class Reporter:
    """Rank 0 reports (other ranks stay silent); events come from the loop and the checkpoint thread."""

    def __init__(self, enabled: bool, stream: TextIO = sys.stdout):
        self.enabled, self.stream = enabled, stream
        self._lock = threading.Lock()
        self._bar: Progress | None = None
        console = Console(file=stream)  # honours TTY_INTERACTIVE=0 (mpirun hands ranks a pty)
        if enabled and console.is_interactive:
            self._bar = Progress(TextColumn("[bold]train[/] {task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeRemainingColumn(), console=console)
            self._task = self._bar.add_task("", total=None)

    def start(self, total_steps: int, completed: int) -> None:
        if self._bar:
            self._bar.update(self._task, total=total_steps, completed=completed)
            self._bar.start()

    def step(self) -> None:
        if self._bar:
            self._bar.advance(self._task)

    def event(self, event: Event) -> None:
        if not self.enabled:
            return
        if self._bar is None:
            self._write(json.dumps(event))
        elif event["event"] == "epoch":
            self._bar.update(self._task, description=f"epoch {event['epoch']} loss {event['loss']:.4f}")
        else:
            style = "yellow" if event["event"] in WARNINGS else "dim"
            details = " ".join(f"{key}={value}" for key, value in event.items() if key != "event")
            self._bar.console.log(f"[{style}]{event['event']}[/] {details}")

    def done(self, event: Event) -> None:
        """Close the bar and print the one ``done`` JSON line."""
        if not self.enabled:
            return
        if self._bar:
            self._bar.stop()
        self._write(json.dumps(event))

    def _write(self, line: str) -> None:
        with self._lock:
            self.stream.write(line + "\n")
            self.stream.flush()
