"""A sampler for elastic gangs: shards a dataset by rank and, after a re-form, shards only what
the epoch has left (Horovod's ``ElasticSampler``).

Each rank records what it processed (:meth:`ElasticSampler.record_batch`); a
:class:`peloton.collective.torch.TorchState` holding the sampler as a value unites the ranks'
records at every commit and sync, so after a rank is lost the survivors re-shard the epoch's
unprocessed indices over the new size (:meth:`ElasticSampler.reset`) and every index of the
epoch is trained on once.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Iterator, Sized
from typing import Any

import torch.utils.data

import peloton.collective as pc

__all__ = ["ElasticSampler"]


class ElasticSampler(torch.utils.data.Sampler[int]):
    """Yields this rank's share of the indices of ``dataset`` not yet processed this epoch.

    ``shuffle`` permutes the indices with ``seed + epoch`` (the same on every rank). The shard is
    padded (with indices from its start) to the same length on every rank. ``num_replicas`` and
    ``rank`` fix the sharding; left None they are read from the runtime at every :meth:`reset`.
    """

    def __init__(
        self,
        dataset: Sized,
        shuffle: bool = True,
        seed: int = 0,
        *,
        num_replicas: int | None = None,
        rank: int | None = None,
    ) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices: set[int] = set()
        self._fixed = (num_replicas, rank)
        self.num_replicas = 1
        self.rank = 0
        self.remaining_indices: list[int] = []
        self.indices: list[int] = []
        self.num_samples = 0
        self.total_size = 0
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Starts ``epoch``: nothing of it is processed yet."""
        self.epoch = epoch
        self.processed_indices = set()
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Marks batch ``batch_idx`` (of ``batch_size``) of the current iteration processed."""
        self.record_indices(self.get_indices(batch_idx, batch_size))

    def record_indices(self, indices: Iterable[int]) -> None:
        """Marks dataset ``indices`` processed this epoch."""
        self.processed_indices.update(int(i) for i in indices)

    def get_indices(self, batch_idx: int, batch_size: int) -> list[int]:
        """The dataset indices of batch ``batch_idx`` of the current iteration."""
        start = batch_idx * batch_size
        return self.indices[start : min(start + batch_size, len(self.indices))]

    def state_dict(self) -> dict[str, Any]:
        """The epoch and the indices processed in it."""
        return {"epoch": self.epoch, "processed_indices": set(self.processed_indices)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Takes a :meth:`state_dict` and re-shards what it leaves (see :meth:`reset`)."""
        self.epoch = int(state_dict["epoch"])
        self.processed_indices = set(state_dict["processed_indices"])
        self.reset()

    def reset(self, num_replicas: int | None = None, rank: int | None = None) -> None:
        """Shards the epoch's unprocessed indices over ``num_replicas`` ranks (default: the fixed
        values, else the runtime's size and rank, else 1 and 0)."""
        fixed_n, fixed_r = self._fixed
        live = pc.is_initialized()
        n = num_replicas or fixed_n or (pc.size() if live else 1)
        r = rank if rank is not None else fixed_r if fixed_r is not None else (
            pc.rank() if live else 0
        )  # fmt: skip
        if not 0 <= r < n:
            raise ValueError(f"ElasticSampler: rank {r} is not in 0..{n - 1}")
        self.num_replicas, self.rank = n, r
        remaining = [i for i in range(len(self.dataset)) if i not in self.processed_indices]
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(remaining)
        self.remaining_indices = remaining
        self.num_samples = math.ceil(len(remaining) / n)
        self.total_size = self.num_samples * n
        self.indices = self._shard()

    def _shard(self) -> list[int]:
        indices = list(self.remaining_indices)
        if indices:
            while len(indices) < self.total_size:
                indices += indices[: self.total_size - len(indices)]
        return indices[self.rank : self.total_size : self.num_replicas]

    def __iter__(self) -> Iterator[int]:
        self.indices = self._shard()
        return iter(self.indices)

    def __len__(self) -> int:
        return self.num_samples
