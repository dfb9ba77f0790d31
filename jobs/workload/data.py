"""The synthetic dataset and the models, both fixed by the seed."""

from __future__ import annotations

import ctypes
import hashlib
from collections.abc import Iterator, Sized

import torch
from torch import nn
from torch.utils.data import DataLoader, Sampler, TensorDataset

FEATURES = 20


def synthetic_dataset(size: int, seed: int) -> TensorDataset:
    """``size`` samples of a noisy linear target; the same seed gives the same bytes."""
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.rand(size, FEATURES, generator=generator)
    true_weights = torch.randn(FEATURES, 1, generator=generator)
    targets = inputs @ true_weights + 0.1 * torch.randn(size, 1, generator=generator)
    return TensorDataset(inputs, targets)


def build_model(name: str, seed: int, dropout: float = 0.0) -> nn.Module:
    """``linear`` is the tutorial's ``Linear(20, 1)``; ``mlp`` is a larger model for benchmarks, with
    ``dropout`` after each hidden layer (per-rank randomness)."""
    torch.manual_seed(seed)
    if name == "linear":
        return nn.Linear(FEATURES, 1)
    if name == "mlp":
        hidden = [nn.Linear(FEATURES, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU()]
        if dropout:
            hidden = [*hidden[:2], nn.Dropout(dropout), *hidden[2:], nn.Dropout(dropout)]
        return nn.Sequential(*hidden, nn.Linear(512, 1))
    raise ValueError(f"unknown model {name!r}")


class ResumableSampler(Sampler[int]):
    """DistributedSampler's order, resumable after any number of samples, at any world size.

    An epoch's order is a permutation fixed by the seed and the epoch, padded (with its first samples)
    to a multiple of the world size and dealt round-robin: at step ``s`` the ranks together train
    samples ``s*B*W`` to ``(s+1)*B*W`` of it. ``set_position(epoch, consumed)`` starts after the first
    ``consumed`` samples and deals the rest to this world size, so an unchanged world size continues
    exactly as an uninterrupted run, and another one trains each remaining sample once.
    """

    def __init__(self, dataset: Sized, batch_size: int, rank: int, world_size: int, seed: int):
        self.size, self.batch_size, self.rank, self.world_size, self.seed = (
            len(dataset), batch_size, rank, world_size, seed)
        self.epoch = self.consumed = 0

    def set_position(self, epoch: int, consumed: int = 0) -> None:
        self.epoch, self.consumed = epoch, consumed

    @property
    def num_samples(self) -> int:
        """Samples this rank trains in the rest of the epoch."""
        return -(-max(0, self.size - self.consumed) // self.world_size)

    @property
    def batches_per_epoch(self) -> int:
        """Batches this rank trains in a whole epoch."""
        return -(-(-(-self.size // self.world_size)) // self.batch_size)

    def _order(self) -> list[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.size, generator=generator).tolist()
        rest = order[self.consumed:]
        padding = -len(rest) % self.world_size
        return rest + (order * (padding // len(order) + 1))[:padding]

    def __iter__(self) -> Iterator[int]:
        return iter(self._order()[self.rank::self.world_size])

    def __len__(self) -> int:
        return self.num_samples


def build_loader(dataset: TensorDataset, batch_size: int, rank: int, world_size: int, seed: int) -> DataLoader:
    """Each rank reads its own share; call ``loader.sampler.set_position(epoch, consumed)`` every epoch.

    The loader draws a seed for its workers each time an epoch starts: from a generator of its own, not the
    rank's global one, whose state a checkpoint saves (else a mid-epoch resume would shift every later draw)."""
    sampler = ResumableSampler(dataset, batch_size, rank, world_size, seed)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, pin_memory=torch.cuda.is_available(),
                      generator=torch.Generator().manual_seed(seed))


def weights_sha256(model: nn.Module) -> str:
    """sha256 over the state_dict tensors in sorted key order (names included)."""
    return state_sha256(model.state_dict())


def state_sha256(state: dict[str, torch.Tensor]) -> str:
    """sha256 over the tensors of ``state`` in sorted key order (names included)."""
    digest = hashlib.sha256()
    for key, tensor in sorted(state.items()):
        digest.update(key.encode())
        # the tensor's raw bytes, read in one call (bytes(storage) reads one element at a time: seconds per MB);
        # numpy is not a torch dependency
        flat = tensor.detach().cpu().contiguous()
        digest.update(ctypes.string_at(flat.data_ptr(), flat.numel() * flat.element_size()) if flat.numel() else b"")
    return digest.hexdigest()
