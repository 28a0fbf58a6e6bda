"""The PyTorch reader's method, :meth:`TorchReader.torch_dataset` (a method of
:class:`windowkit.Store`), and its options. What it returns,
:class:`windowkit.readers.torch_dataset.WindowTorchDataset`, lives in
:mod:`windowkit.readers.torch_dataset`, which imports PyTorch: this module
does not, so a store opens without it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from windowkit.errors import InvalidSpecError, check_int
from windowkit.readers.options import BatchOptions, ShuffleOptions
from windowkit.readers.plan import PlanSource

if TYPE_CHECKING:
    from windowkit.readers.torch_dataset import WindowTorchDataset


class TorchReader(PlanSource):
    """:meth:`torch_dataset`, a method of :class:`windowkit.Store`."""

    def torch_dataset(self, split: str = "train", batch_size: int = 256, *,
                      shuffle: bool | str = True, seed: int = 0, normalize: bool = False,
                      drop_remainder: bool = False, rank: int | None = None,
                      world_size: int | None = None, return_series: bool = False,
                      memory_budget: int | None = None,
                      spill_dir: str | os.PathLike[str] | None = None,
                      cache_bytes: int | None = None) -> WindowTorchDataset:
        """A map-style ``torch.utils.data.Dataset`` whose item ``i`` is batch ``i``
        of the epoch (tensors: ``x``, ``(x, y)``, or dicts of fields), a
        :class:`windowkit.readers.torch_dataset.WindowTorchDataset`, for
        ``DataLoader(ds, batch_size=None, num_workers=N)``; call
        ``ds.set_epoch(e)`` before each epoch.

        :param split: the split to read.
        :param batch_size: windows per batch (per rank).
        :param shuffle: as for :meth:`tf_dataset`.
        :param seed: fixes every epoch's order (the same in every worker and rank).
        :param normalize: ``(x - mean) / std`` with the training rows' statistics.
        :param drop_remainder: leave out the last, smaller batch of an epoch.
        :param rank: this process's shard, ``0 .. world_size - 1`` (default:
            ``torch.distributed``'s rank when it is initialized, else 0).
        :param world_size: how many shards (default: ``torch.distributed``'s
            world size when it is initialized, else 1). Each rank owns a
            contiguous piece of the split (as ``num_shards`` does) and yields the
            same number of batches; the dataset's items are every rank's batches,
            interleaved, for a ``DistributedSampler(ds, shuffle=False)`` (which
            Lightning and Accelerate add by default) to split.
        :param return_series: add each window's series id to ``x``.
        :param memory_budget: as for :meth:`tf_dataset` (per process).
        :param spill_dir: as for :meth:`tf_dataset`.
        :param cache_bytes: experts: bytes of blocks cached (implies block groups).
        """
        from windowkit.readers.epoch.batches import EpochBatches
        from windowkit.readers.torch_dataset import WindowTorchDataset

        batch = BatchOptions.checked(batch_size, drop_remainder=drop_remainder,
                                     normalize=normalize, return_series=return_series)
        order = ShuffleOptions.checked(shuffle, seed=seed, memory_budget=memory_budget,
                                       spill_dir=spill_dir, cache_bytes=cache_bytes)
        rank, world_size = distributed_shard(rank, world_size)
        plan = self.read_plan(split).shard_of(world_size, rank)
        return WindowTorchDataset(EpochBatches(plan, batch, order), rank=rank,
                                  world_size=world_size)


def distributed_shard(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``(rank, world_size)``: as given, else ``torch.distributed``'s when it
    is initialized, else ``(0, 1)``; one line when they do not fit together."""
    if rank is None and world_size is None:
        import torch

        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
        return 0, 1
    if rank is None or world_size is None:
        raise InvalidSpecError("rank and world_size go together")
    size = check_int("world_size", world_size, 1)
    index = check_int("rank", rank, 0)
    if index >= size:
        raise InvalidSpecError(f"rank must be in 0..{size - 1}, got {index}")
    return index, size


def __getattr__(name: str) -> Any:
    """``windowkit.readers.torch.WindowTorchDataset`` (and its sampler) as
    before they moved to :mod:`windowkit.readers.torch_dataset`: imported when
    asked for, since they load PyTorch."""
    if name in ("WindowTorchDataset", "WindowSampler"):
        from windowkit.readers import torch_dataset

        return getattr(torch_dataset, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
