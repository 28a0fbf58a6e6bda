"""Batch ``i`` of epoch ``e``, as NumPy: what every framework's loader reads.

:class:`EpochBatches` answers ``batch(epoch, index)`` for one split (or one
shard of it), in any order, from any thread or process: each epoch's order is
a pure function of the seed and the epoch, so a loader's position is all its
state and a resumed run yields exactly the batches an uninterrupted one would.
The Keras ``PyDataset``, the PyTorch ``Dataset`` and the Grain source are thin
front ends over it.

How batches are cut follows the shuffle chosen for the plan
(:func:`windowkit.readers.options.choose_shuffle`): a uniform shuffle holds
the split's rows once (:mod:`windowkit.readers.numpy_engine.held`) and cuts a
batch with one NumPy gather; block groups and index order cut from a cache of
decoded blocks (:mod:`windowkit.readers.numpy_engine.pool`).

Sharded, an epoch is the whole split's order restricted to the shard's own
windows (:mod:`windowkit.readers.shares`), padded (its last window repeated)
or trimmed so that every shard yields the same number of batches (what
distributed training needs: every rank steps together).

It pickles as its plan and options; each process builds its own block cache
on first use. Rows held before a ``fork`` are shared with the forked workers.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from windowkit.readers.numpy_engine.held import UniformBatches, uniform_source
from windowkit.readers.numpy_engine.order import EpochOrder, WindowOrder, num_batches
from windowkit.readers.numpy_engine.pool import WindowGather
from windowkit.readers.options import BatchOptions, ShuffleOptions
from windowkit.readers.shares import ShardSequence
from windowkit.sampler import group_size
from windowkit.stats import Normalizer

if TYPE_CHECKING:
    from windowkit.readers.plan import ReadPlan

Batch = Any  # x, (x, y), or with fields a dict x (windowkit.readers.numpy_engine.fields)

# built per process, never pickled; "_uniform" is kept by forked workers (shared rows)
_PROCESS_LOCAL = ("_lock", "_pid", "_local", "_checked_epoch")


@dataclass(frozen=True)
class _Local:
    """What one process builds to cut batches from blocks."""

    gather: WindowGather
    sequence: ShardSequence  # the plan's epoch positions -> the split's index positions
    normalizer: Normalizer | None


class EpochBatches:
    """Every epoch's batches of one plan, by ``(epoch, index)``."""

    def __init__(self, plan: ReadPlan, batch: BatchOptions | None = None,
                 order: ShuffleOptions | None = None) -> None:
        self.plan = plan
        self.batch, self.order = batch or BatchOptions(), order or ShuffleOptions()
        self.fields = plan.store.fields(self.batch.return_series)
        self.choice = self.order.choose(plan)
        if self.batch.normalize:
            plan.store.normalizer()  # fail now, not in a worker, if the store has no statistics
        self.windows_per_epoch = plan.windows_per_epoch(self.batch.drop_remainder)
        self._reset_process_state()
        self._uniform: UniformBatches | None = None

    # -- pickling and per-process state ---------------------------------------------
    def _reset_process_state(self) -> None:
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._local: _Local | None = None
        self._checked_epoch: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()
                if k not in (*_PROCESS_LOCAL, "_uniform")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset_process_state()
        self._uniform = None  # held again by this process on first use

    def _this_process(self) -> None:
        """After a fork, drop the parent's lock and block cache (the held rows stay)."""
        if self._pid != os.getpid():
            self._reset_process_state()

    # -- what an epoch holds ---------------------------------------------------------
    @property
    def holds_rows(self) -> bool:
        """Whether batches come from the split's rows held once (any uniform
        shuffle: random access in NumPy is the fast way here)."""
        return self.choice.mode in ("uniform", "whole")

    @property
    def batch_size(self) -> int:
        return self.batch.batch_size

    @property
    def batches_per_epoch(self) -> int:
        return num_batches(self.windows_per_epoch, self.batch_size, self.batch.drop_remainder)

    def hold(self) -> None:
        """Hold the rows now when batches come from held rows (so that workers
        forked later share them); else nothing."""
        if self.holds_rows:
            self._uniform_batches()

    def _uniform_batches(self) -> UniformBatches:
        self._this_process()
        with self._lock:
            if self._uniform is None:
                self._uniform = uniform_source(
                    self.plan, batch_size=self.batch_size, seed=self.order.seed,
                    normalize=self.batch.normalize, memory_budget=self.choice.memory_budget,
                    fields=self.fields, spill_dir=self.order.spill_dir,
                    drop_remainder=self.batch.drop_remainder)
            return self._uniform

    def _process_local(self) -> _Local:
        self._this_process()
        with self._lock:
            if self._local is None:
                plan = self.plan
                gather = plan.store.window_gather(self.choice.cache_bytes)
                order = WindowOrder(
                    plan.whole_split, shuffle=self.choice.mode == "blocks",
                    seed=self.order.seed, block_rows=gather.pool.block_rows,
                    total_rows=plan.layout.total_rows,
                    blocks_per_group=group_size(plan, self.order.shuffle_blocks,
                                                cache_bytes=self.choice.cache_bytes))
                epochs = _EpochCache(order)
                sequence = ShardSequence(plan.shard_share, epochs.positions,
                                         ordered=not order.sampler.shuffle)
                norm = plan.store.normalizer() if self.batch.normalize else None
                self._local = _Local(gather, sequence, norm)
            return self._local

    def _check_store(self, epoch: int) -> None:
        """Once per epoch: a replaced store is an error, even for rows already held."""
        if self._checked_epoch != epoch:
            self.plan.store.guard.check()
            self._checked_epoch = epoch

    # -- batches ---------------------------------------------------------------------
    def positions(self, index: int) -> np.ndarray:
        """The epoch positions batch ``index`` holds (past a shard's own windows,
        a padded epoch repeats its last one)."""
        if not 0 <= index < self.batches_per_epoch:
            raise IndexError(f"batch {index} is out of range for {self.batches_per_epoch} "
                             "batches")
        lo = index * self.batch_size
        return np.arange(lo, min(lo + self.batch_size, self.windows_per_epoch), dtype=np.int64)

    def batch_at(self, epoch: int, index: int) -> Batch:
        """Batch ``index`` (0 first) of epoch ``epoch``."""
        return self.windows_at(epoch, self.positions(index))

    def windows_at(self, epoch: int, where: np.ndarray) -> Batch:
        """The windows at epoch positions ``where`` of epoch ``epoch``, as one batch."""
        self._this_process()
        self._check_store(epoch)
        if self.holds_rows:
            return self._uniform_batches().windows_at(epoch, where)
        local, fields = self._process_local(), self.fields
        starts, series = self.plan.whole_split.global_starts_and_series(
            local.sequence.positions(epoch, where))
        targets = self.plan.store.target_positions
        x, horizon = local.gather.cut(starts, fields.horizon_columns(targets))
        return fields.assemble(x, horizon, series if fields.series else None,
                               targets=targets, norm=local.normalizer)


class _EpochCache:
    """The split's order of the latest epoch asked for (threads share it)."""

    def __init__(self, order: WindowOrder) -> None:
        self.order = order
        self._current: tuple[int, EpochOrder] | None = None

    def positions(self, epoch: int, where: np.ndarray) -> np.ndarray:
        current = self._current
        if current is None or current[0] != epoch:
            current = (epoch, self.order.epoch(epoch))
            self._current = current
        return current[1].positions_at(where)
