"""The Keras reader's method, :meth:`KerasReader.keras_dataset` (a method of
:class:`windowkit.Store`), and its options. What it returns,
:class:`windowkit.readers.keras_pydataset.WindowPyDataset`, lives in
:mod:`windowkit.readers.keras_pydataset`, which imports Keras: this module
does not, so a store opens without it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from windowkit.readers.options import BatchOptions, ShardOptions, ShuffleOptions
from windowkit.readers.plan import PlanSource

if TYPE_CHECKING:
    from windowkit.readers.keras_pydataset import WindowPyDataset


class KerasReader(PlanSource):
    """:meth:`keras_dataset`, a method of :class:`windowkit.Store`."""

    def keras_dataset(self, split: str = "train", batch_size: int = 256, *,
                      shuffle: bool | str = True, seed: int = 0, drop_remainder: bool = False,
                      normalize: bool = False, workers: int = 1,
                      use_multiprocessing: bool = False, max_queue_size: int = 10,
                      memory_budget: int | None = None,
                      spill_dir: str | os.PathLike[str] | None = None,
                      num_shards: int | None = None, shard_index: int | None = None,
                      return_series: bool = False, cache_bytes: int | None = None
                      ) -> WindowPyDataset:
        """A ``keras.utils.PyDataset`` of batches of windows, a
        :class:`windowkit.readers.keras_pydataset.WindowPyDataset`: one batch
        loaded at a time, on any Keras backend; pass ``shuffle=False`` to ``fit``.

        :param split: the split to read.
        :param batch_size: windows per batch.
        :param shuffle: as for :meth:`tf_dataset`.
        :param seed: fixes every epoch's order.
        :param drop_remainder: leave out the last, smaller batch of an epoch.
        :param normalize: ``(x - mean) / std`` with the training rows' statistics.
        :param workers: Keras' loader threads or processes.
        :param use_multiprocessing: processes instead of threads.
        :param max_queue_size: batches Keras queues ahead.
        :param memory_budget: as for :meth:`tf_dataset`.
        :param spill_dir: as for :meth:`tf_dataset`.
        :param num_shards: as for :meth:`tf_dataset`.
        :param shard_index: as for :meth:`tf_dataset`.
        :param return_series: add each window's series id to ``x``.
        :param cache_bytes: experts: bytes of blocks cached (implies block groups).
        """
        from windowkit.readers.keras_pydataset import WindowPyDataset

        batch = BatchOptions.checked(batch_size, drop_remainder=drop_remainder,
                                     normalize=normalize, return_series=return_series)
        order = ShuffleOptions.checked(shuffle, seed=seed, memory_budget=memory_budget,
                                       spill_dir=spill_dir, cache_bytes=cache_bytes)
        plan = self._shard_plan(split, ShardOptions.checked(num_shards, shard_index))
        return WindowPyDataset(plan, batch, order, workers=workers,
                               use_multiprocessing=use_multiprocessing,
                               max_queue_size=max_queue_size)


def __getattr__(name: str) -> Any:
    """``windowkit.readers.keras.WindowPyDataset`` (and its callback) as before
    they moved to :mod:`windowkit.readers.keras_pydataset`: imported when
    asked for, since they load Keras."""
    if name in ("WindowPyDataset", "WindowBackupAndRestore"):
        from windowkit.readers import keras_pydataset

        return getattr(keras_pydataset, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
