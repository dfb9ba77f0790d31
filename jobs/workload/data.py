"""The synthetic dataset and the models, both fixed by the seed."""

from __future__ import annotations

import ctypes
import hashlib
import itertools
from collections.abc import Iterator

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

FEATURES = 20


def synthetic_dataset(size: int, seed: int) -> TensorDataset:
    """``size`` samples of a noisy linear target; the same seed gives the same bytes."""
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.rand(size, FEATURES, generator=generator)
    true_weights = torch.randn(FEATURES, 1, generator=generator)
    targets = inputs @ true_weights + 0.1 * torch.randn(size, 1, generator=generator)
    return TensorDataset(inputs, targets)


def build_model(name: str, seed: int) -> nn.Module:
    """``linear`` is the tutorial's ``Linear(20, 1)``; ``mlp`` is a larger model for benchmarks."""
    torch.manual_seed(seed)
    if name == "linear":
        return nn.Linear(FEATURES, 1)
    if name == "mlp":
        return nn.Sequential(nn.Linear(FEATURES, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 1))
    raise ValueError(f"unknown model {name!r}")


class ResumableSampler(DistributedSampler):
    """A DistributedSampler that can start an epoch part-way: at batch ``start_batch`` of ``batch_size``.

    The order of an epoch depends only on the seed and the epoch, so skipping the indices of the
    batches already trained gives exactly the batches an uninterrupted run would train next.
    """

    def __init__(self, dataset: TensorDataset, batch_size: int, rank: int, world_size: int, seed: int):
        super().__init__(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
        self.batch_size, self.start_batch = batch_size, 0

    def set_position(self, epoch: int, start_batch: int = 0) -> None:
        self.set_epoch(epoch)
        self.start_batch = start_batch

    @property
    def batches_per_epoch(self) -> int:
        return -(-self.num_samples // self.batch_size)

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(super().__iter__(), self.start_batch * self.batch_size, None)

    def __len__(self) -> int:
        return max(0, self.num_samples - self.start_batch * self.batch_size)


def build_loader(dataset: TensorDataset, batch_size: int, rank: int, world_size: int, seed: int) -> DataLoader:
    """Each rank reads its own shard; call ``loader.sampler.set_position(epoch, start_batch)`` every epoch."""
    sampler = ResumableSampler(dataset, batch_size, rank, world_size, seed)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, pin_memory=torch.cuda.is_available())


def weights_sha256(model: nn.Module) -> str:
    """sha256 over the state_dict tensors in sorted key order (names included)."""
    digest = hashlib.sha256()
    for key, tensor in sorted(model.state_dict().items()):
        digest.update(key.encode())
        # the tensor's raw bytes, read in one call (bytes(storage) reads one element at a time: seconds per MB);
        # numpy is not a torch dependency
        flat = tensor.detach().cpu().contiguous()
        digest.update(ctypes.string_at(flat.data_ptr(), flat.numel() * flat.element_size()) if flat.numel() else b"")
    return digest.hexdigest()
