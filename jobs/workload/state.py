"""What a checkpoint holds besides the model and the optimizer, each object owning its own state.

Every object here is ``Stateful`` (``state_dict``/``load_state_dict``, torch.distributed.checkpoint's
protocol) and is registered once with the CheckpointManager: ``TrainProgress`` is the same on every
rank and saved once; ``RankRNG`` is each rank's own and saved per rank.
"""

from __future__ import annotations

import hashlib
import random
import sys
from dataclasses import dataclass
from typing import Any

import torch


def rank_seed(seed: int, rank: int) -> int:
    """A 63-bit seed of its own for every (seed, rank): per-rank randomness differs between ranks."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{rank}".encode()).digest()[:8], "big") >> 1


class RankRNG:
    """This rank's random generators: torch's CPU generator, its own CUDA device's, Python's and NumPy's.

    Each rank saves and restores only its own; ``reseed`` starts them from the run's seed and the rank
    (a new run, or a rank that did not exist when the checkpoint was written).
    """

    def __init__(self, seed: int, rank: int, device: torch.device):
        self.seed, self.rank, self.device = seed, rank, device

    def reseed(self) -> None:
        seed = rank_seed(self.seed, self.rank)
        random.seed(seed)
        torch.manual_seed(seed)  # also seeds every CUDA device
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed(seed % 2**32)

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
        if self.device.type == "cuda":
            state["cuda"] = torch.cuda.get_rng_state(self.device)
        if "numpy" in sys.modules:
            kind, keys, position, has_gauss, gauss = sys.modules["numpy"].random.get_state()
            state["numpy"] = {"kind": kind, "keys": torch.from_numpy(keys.astype("int64")), "position": position,
                              "has_gauss": has_gauss, "gauss": gauss}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        torch.set_rng_state(state["torch"])
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
        if self.device.type == "cuda" and "cuda" in state:
            torch.cuda.set_rng_state(state["cuda"], self.device)
        if "numpy" in state and "numpy" in sys.modules:
            saved = state["numpy"]
            sys.modules["numpy"].random.set_state((saved["kind"], saved["keys"].numpy().astype("uint32"), saved["position"],
                                                   saved["has_gauss"], saved["gauss"]))


@dataclass
class TrainProgress:
    """Where training is: the epoch, the samples of it already trained (all ranks together), the global step.

    Samples, not steps, so the position means the same after a resize (another world size).
    """

    epoch: int = 0
    epoch_samples: int = 0
    global_step: int = 0

    def advance(self, samples: int) -> None:
        self.global_step += 1
        self.epoch_samples += samples

    def end_epoch(self) -> None:
        self.epoch, self.epoch_samples = self.epoch + 1, 0

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "epoch_samples": self.epoch_samples, "global_step": self.global_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        values = {key: state[key] for key in ("epoch", "epoch_samples", "global_step")}
        if not all(isinstance(value, int) and value >= 0 for value in values.values()):
            raise ValueError(f"progress {values} is not three counts")
        self.epoch, self.epoch_samples, self.global_step = values["epoch"], values["epoch_samples"], values["global_step"]
