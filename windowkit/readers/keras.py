"""The Keras reader: a ``keras.utils.PyDataset`` of whole batches.

``__getitem__(i)`` finds the windows of batch ``i`` in the epoch's seeded order
(:class:`windowkit.readers.EpochOrder`, random access, so Keras workers may ask for
batches in any order) and resolves them with one vectorized gather over a block
cache. ``on_epoch_end`` moves on to the next epoch's order.

The dataset pickles as its read plan and arguments (the compact window runs
travel along); each process builds its own block cache on first use, so it
works with ``workers > 1`` threads and with ``use_multiprocessing=True``.

The dataset already shuffles: pass ``shuffle=False`` to ``model.fit``, which
otherwise also shuffles the batch order and so defeats the block cache.
"""

from __future__ import annotations

import operator
import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import keras
import numpy as np

from windowkit.errors import check_int
from windowkit.readers import (
    DEFAULT_CACHE_BYTES,
    DEFAULT_MEMORY_BUDGET,
    EpochOrder,
    WindowGather,
    WindowOrder,
    check_shuffle,
    num_batches,
)
from windowkit.readers._global import check_memory_budget
from windowkit.stats import Normalizer

if TYPE_CHECKING:
    from windowkit.readers.plan import ReadPlan

Batch = np.ndarray | tuple[np.ndarray, np.ndarray]

# attributes built per process, never pickled
_PROCESS_LOCAL = ("_lock", "_pid", "_local", "_current")


@dataclass(frozen=True)
class _Local:
    """What one process builds to read batches."""

    gather: WindowGather
    order: WindowOrder
    normalizer: Normalizer | None
    target_normalizer: Normalizer | None


class WindowPyDataset(keras.utils.PyDataset):
    """Batches of windows of one split of a store: ``x``, or ``(x, y)`` with a horizon.

    Build it with :meth:`windowkit.Store.keras_dataset`.
    """

    def __init__(self, plan: ReadPlan, batch_size: int = 256, *,
                 shuffle: bool | str = True, seed: int = 0, drop_remainder: bool = False,
                 normalize: bool = False, workers: int = 1, use_multiprocessing: bool = False,
                 max_queue_size: int = 10, cache_bytes: int = DEFAULT_CACHE_BYTES,
                 memory_budget: int = DEFAULT_MEMORY_BUDGET) -> None:
        super().__init__(workers=check_int("workers", workers, 0),
                         use_multiprocessing=bool(use_multiprocessing),
                         max_queue_size=check_int("max_queue_size", max_queue_size, 1))
        self.plan = plan
        self.batch_size = check_int("batch_size", batch_size, 1)
        self.shuffle = check_shuffle(shuffle)
        self.seed = check_int("seed", seed, 0)
        self.drop_remainder = bool(drop_remainder)
        self.normalize = bool(normalize)
        self.cache_bytes = check_int("cache_bytes", cache_bytes, 1)
        if self.shuffle == "global":  # every block held: one group, a uniform permutation
            needed = check_memory_budget(plan, check_int("memory_budget", memory_budget, 1))
            self.cache_bytes = max(self.cache_bytes, needed)
        if normalize:
            plan.normalizer()  # fail now, not in a worker, if the store has no statistics
        self._epoch = 0
        self._reset_process_state()

    # -- pickling and per-process state ---------------------------------------------
    def _reset_process_state(self) -> None:
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._local: _Local | None = None
        self._current: tuple[int, EpochOrder] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in _PROCESS_LOCAL}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset_process_state()

    def _process_local(self) -> _Local:
        if self._pid != os.getpid():  # a forked worker: the parent's lock and cache are not ours
            self._reset_process_state()
        with self._lock:
            if self._local is None:
                plan = self.plan
                gather = plan.window_gather(self.cache_bytes)
                order = WindowOrder(
                    plan.runs, shuffle=bool(self.shuffle), seed=self.seed,
                    block_rows=gather.pool.block_rows, total_rows=plan.total_rows,
                    blocks_per_group=((lambda n: max(1, n)) if self.shuffle == "global"
                                      else gather.blocks_per_group))
                norm = plan.normalizer() if self.normalize else None
                target_norm = plan.target_normalizer() if norm else None
                self._local = _Local(gather, order, norm, target_norm)
            return self._local

    def _epoch_order(self, local: _Local) -> EpochOrder:
        epoch, current = self._epoch, self._current
        if current is None or current[0] != epoch:
            current = (epoch, local.order.epoch(epoch))
            self._current = current
        return current[1]

    # -- the PyDataset protocol ------------------------------------------------------
    @property
    def epoch(self) -> int:
        """The epoch whose order ``__getitem__`` follows (0 first); settable to resume."""
        return self._epoch

    @epoch.setter
    def epoch(self, value: int) -> None:
        self._epoch = check_int("epoch", value, 0)

    @property
    def num_windows(self) -> int:
        return self.plan.num_windows

    def __len__(self) -> int:
        return num_batches(self.plan.num_windows, self.batch_size, self.drop_remainder)

    def __getitem__(self, index: int) -> Batch:
        """Batch ``index`` of the current epoch (negative counts from the end)."""
        i = operator.index(index)
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"batch {index} is out of range for {n} batches")
        i %= n
        local = self._process_local()
        x, y = local.gather(self._epoch_order(local).batch(i, self.batch_size))
        if local.normalizer is not None:
            x = local.normalizer(x)
            y = local.target_normalizer(y) if y is not None and local.target_normalizer else y
        return x if y is None else (x, y)

    def on_epoch_end(self) -> None:
        """Move on to the next epoch's order (``fit`` also calls this once before
        its first epoch, which therefore reads order 1)."""
        self._epoch += 1

    def __repr__(self) -> str:
        return (f"<windowkit.WindowPyDataset {str(self.plan.path)!r} split={self.plan.split!r} "
                f"batches={len(self)} batch_size={self.batch_size} shuffle={self.shuffle} "
                f"epoch={self._epoch}>")
