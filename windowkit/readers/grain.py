"""Grain random-access data sources of one split: whole batches, or windows.

Both implement Grain's ``RandomAccessDataSource`` protocol (``__len__``,
``__getitem__``, and a ``__repr__`` naming what the items depend on, which
Grain's checkpoints compare on restore), pickle as their read plan and
arguments (Grain's worker processes build their own state), and hold the
split's rows once per process on first use where they read them by random
access (in memory within ``memory_budget``, else spilled to a private file on
local disk).

**Whole batches**, :class:`BatchGrainSource`
(:meth:`windowkit.Store.grain_batches`), the fast one: item ``i`` is a whole
batch (NumPy: ``x``, ``(x, y)`` or a dict of fields), the Keras reader's batch
of the same epoch window for window, cut by
:class:`windowkit.readers.epoch.batches.EpochBatches` with one gather;
Grain's cost per element is then paid once a batch::

    src = store.grain_batches("train", 256, epochs=10)
    for x, y in src.iter_dataset():  # MapDataset.source(src).to_iter_dataset(), checked
        ...

Grain hands a source only indices below its ``len`` (``MapDataset.repeat`` and
``IndexSampler(num_epochs=...)`` take them modulo ``len``), so a source never
learns Grain's epoch; this one holds ``epochs`` epochs one after another
instead, each in its own seeded order: item ``i`` is batch
``i % batches_per_epoch`` of epoch ``epoch + i // batches_per_epoch``. An item
depends on nothing but its index, so Grain's iterator checkpoints resume
exactly; those of :meth:`BatchGrainSource.iter_dataset` also say what they
were saved for, and are checked on restore. It checks the store once per
epoch, as the other batch readers do.

**Windows**, :class:`WindowGrainSource` (:meth:`windowkit.Store.grain_source`),
for pipelines that shuffle, batch or transform per window in Grain:
``source[i]`` is window ``i`` of the split's index (``x``, ``(x, y)`` with a
horizon, or a dict of fields: the same structure as a batch of the other
readers, without the batch axis)::

    src = store.grain_source("train")
    ds = grain.MapDataset.source(src).shuffle(seed=0).batch(256)

It offers Grain's batched read ``_getitems`` (one NumPy gather for many
windows, which Grain uses where it batches reads), and holds the split's rows
whatever the shuffle: every window is one contiguous row range, read in any
order. A store replaced while it is read (``convert --overwrite``) is
:class:`windowkit.errors.StoreReplacedError`, never its old rows served on:
this source has no epochs, so it checks the store (a ``stat`` of its
directory) when it holds the rows, then before a read once
``CHECK_SECONDS`` have passed or ``len(src)`` windows (a pass over the split)
were read since the last check: an error within about a second of reading,
and on the first read of the next pass at the latest, spilled rows included.

Indices are integers (Python or NumPy), negative ones counting from the end,
in ``src[i]`` and in ``_getitems`` alike; a float or a bool is a ``TypeError``
(``_getitems([1.7])`` is no window 1) and one out of range an ``IndexError``,
each one line naming it.
"""

from __future__ import annotations

import bisect
import math
import operator
import os
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from windowkit.errors import check_int
from windowkit.readers.epoch.batches import Batch, EpochBatches
from windowkit.readers.options import (
    BatchOptions,
    ShardOptions,
    ShuffleOptions,
    check_budget,
    default_memory_budget,
)
from windowkit.readers.plan import PlanSource
from windowkit.readers.rows.held import HeldRows

if TYPE_CHECKING:
    from windowkit.readers.fields import BatchFields
    from windowkit.readers.plan import ReadPlan
    from windowkit.stats import Normalizer


#: built per process, never pickled
_PROCESS_LOCAL = ("_lock", "_held", "_runs", "_checked_at", "_unchecked", "_per_pass")
CHECK_SECONDS = 1.0  # the store is checked again before a read once this has passed


class WindowGrainSource:
    """The windows of one split, by index position. Build it with
    :meth:`windowkit.Store.grain_source`."""

    def __init__(self, plan: ReadPlan, *, normalize: bool = False, return_series: bool = False,
                 memory_budget: int, spill_dir: str | os.PathLike[str] | None = None) -> None:
        self.plan = plan
        self.normalize, self.return_series = normalize, return_series
        self.memory_budget, self.spill_dir = memory_budget, spill_dir
        self.fields: BatchFields = plan.store.fields(return_series)
        self._norm: Normalizer | None = plan.store.normalizer() if normalize else None
        self._columns = self.fields.horizon_columns(plan.store.target_positions)
        self._reset_process_state()

    def _reset_process_state(self) -> None:
        self._lock = threading.Lock()
        self._held: HeldRows | None = None  # held again by each process on first use
        self._runs: tuple[list[int], list[int], list[int], int] | None = None
        self._checked_at = -math.inf  # when the store was last checked (monotonic)
        self._unchecked = 0  # windows read since
        self._per_pass = len(self)  # windows read between checks at most

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in _PROCESS_LOCAL}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset_process_state()

    def _rows(self, windows: int = 0) -> HeldRows:
        """The held rows, before reading ``windows`` windows from them: the store
        checked first when they are held, and again once ``CHECK_SECONDS``
        passed or a pass's worth of windows were read since the last check."""
        with self._lock:
            self._unchecked += windows
            now = time.monotonic()
            if (self._unchecked >= self._per_pass or now - self._checked_at >= CHECK_SECONDS
                    or self._held is None):
                self.plan.store.guard.check()
                self._checked_at, self._unchecked = now, windows
            if self._held is None:
                self._held = HeldRows(self.plan, memory_budget=self.memory_budget,
                                      spill_dir=self.spill_dir)
            return self._held

    def __len__(self) -> int:
        return self.plan.num_windows

    def __getitem__(self, index: int) -> Any:
        """Window ``index`` of the split (negative counts from the end)."""
        i = index if type(index) is int else _index(index)
        n = self._per_pass
        if not -n <= i < n:
            raise IndexError(f"window {index} is out of range for {n} windows")
        start, series = self._locate(i % n)
        x, horizon = self._rows(1).window(start, self._columns)
        batch = self.fields.assemble(x[None], None if horizon is None else horizon[None],
                                     np.array([series], dtype=np.int32),
                                     targets=self.plan.store.target_positions, norm=self._norm)
        return _item(batch, 0)

    def _locate(self, position: int) -> tuple[int, int]:
        """Global start row and series of window ``position``, in plain Python
        (a window at a time, NumPy's call overhead dominates)."""
        table = self._runs
        if table is None:
            runs = self.plan.runs
            table = self._runs = (runs.cumulative.tolist(), runs.global_first.tolist(),
                                  runs.series.tolist(), runs.stride)
        cumulative, first, series, stride = table
        run = bisect.bisect_right(cumulative, position) - 1
        return first[run] + (position - cumulative[run]) * stride, series[run]

    def _getitems(self, indices: Sequence[int]) -> Sequence[Any]:
        """Windows ``indices``, cut with one gather (Grain's batched read);
        indices as for ``src[i]``."""
        where = _positions(indices, len(self))
        if not len(where):
            return []
        batch = self.windows(where)
        return [_item(batch, k) for k in range(len(where))]

    def windows(self, positions: np.ndarray) -> Any:
        """The windows at index positions ``positions``, as one batch."""
        starts, series = self.plan.runs.global_starts_and_series(positions)
        x, horizon = self._rows(len(starts)).windows(starts, self._columns)
        return self.fields.assemble(x, horizon, series if self.fields.series else None,
                                    targets=self.plan.store.target_positions, norm=self._norm)

    def __repr__(self) -> str:
        plan = self.plan
        return (f"WindowGrainSource(store={str(plan.store.path)!r}, "
                f"store_id={plan.store.store_id[:12]!r}, split={plan.split!r}, "
                f"windows={len(self)}, normalize={self.normalize}, "
                f"return_series={self.return_series})")


class BatchGrainSource:
    """Whole batches of one split (or one shard of it), ``epochs`` epochs one
    after another: item ``i`` is batch ``i % batches_per_epoch`` of epoch
    ``epoch + i // batches_per_epoch``, the same batch, window for window, as
    the Keras reader's of that epoch. Build it with
    :meth:`windowkit.Store.grain_batches`."""

    def __init__(self, batches: EpochBatches, *, epoch: int = 0, epochs: int = 1) -> None:
        self.batches = batches
        self.epoch, self.epochs = epoch, epochs
        self.batches_per_epoch = batches.batches_per_epoch

    @property
    def batch_size(self) -> int:
        return self.batches.batch_size

    def __len__(self) -> int:
        """Batches of all ``epochs`` epochs."""
        return self.batches_per_epoch * self.epochs

    def position(self, index: int) -> tuple[int, int]:
        """``(epoch, batch)``: where item ``index`` lies (negative counts from the end)."""
        i = index if type(index) is int else _index(index, "batch")
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"batch {index} is out of range for {n} batches (epochs="
                             f"{self.epochs}, batches_per_epoch={self.batches_per_epoch})")
        epoch, batch = divmod(i % n, self.batches_per_epoch)
        return self.epoch + epoch, batch

    def __getitem__(self, index: int) -> Batch:
        """Item ``index``: batch ``index % batches_per_epoch`` of epoch
        ``epoch + index // batches_per_epoch``, as NumPy arrays."""
        return self.batches.batch_at(*self.position(index))

    def iter_dataset(self, read_options: Any = None) -> Any:
        """``grain.MapDataset.source(self).to_iter_dataset(read_options)``, whose
        iterators' states say what they were saved for: restored into a source
        built otherwise, one line naming what differs; saved in another epoch
        order (another machine's memory budget chose it), that order goes on
        (:mod:`windowkit.readers.grain_checked`)."""
        import grain

        from windowkit.readers.grain_checked import CheckedIterDataset

        return CheckedIterDataset(grain.MapDataset.source(self).to_iter_dataset(read_options),
                                  self)

    def identity(self) -> dict[str, Any]:
        """What the items depend on: the store, split, order, batches, shard and epochs."""
        saved = self.batches.identity()  # with the epoch order (group sizes included)
        batch = self.batches.batch
        return {**saved, "store_id": saved["store_id"][:12], "epoch": self.epoch,
                "epochs": self.epochs, "batches": len(self), "normalize": batch.normalize,
                "return_series": batch.return_series}

    def __repr__(self) -> str:
        """Names everything an item depends on (Grain's checkpoints compare it on
        restore, so restoring into a source built otherwise is refused)."""
        fields = ", ".join(f"{key}={value!r}" for key, value in self.identity().items())
        return f"BatchGrainSource({fields})"


def _index(value: object, what: str = "window") -> int:
    """``value`` as a ``what`` index: an integer (Python or NumPy), not a bool."""
    if not isinstance(value, bool | np.bool_):
        try:
            return operator.index(value)  # type: ignore[arg-type]
        except TypeError:
            pass
    raise TypeError(f"{what} indices are integers, got {value!r} "
                    f"({type(value).__name__})")


def _positions(indices: Sequence[int], n: int) -> np.ndarray:
    """``indices`` as index positions ``0 .. n - 1`` (negative ones count from
    the end): integers only, each in range, else one line naming the first not."""
    if isinstance(indices, np.ndarray):
        if indices.dtype.kind not in "iu":
            raise TypeError(f"window indices are integers, got an array of {indices.dtype}")
        where = indices.ravel()
    else:
        if not set(map(type, indices)) <= {int}:  # Grain's lists of ints: no loop
            indices = [_index(i) for i in indices]
        try:
            where = np.asarray(indices, dtype=np.int64)
        except OverflowError:  # beyond int64: out of range
            bad = next(i for i in indices if not -n <= i < n)
            raise IndexError(f"window {bad} is out of range for {n} windows") from None
    if not len(where):
        return np.zeros(0, dtype=np.int64)
    low, high = where.min(), where.max()
    if low < -n or high >= n:
        bad = where[np.flatnonzero((where < -n) | (where >= n))[0]]
        raise IndexError(f"window {bad} is out of range for {n} windows")
    where = where.astype(np.int64, copy=False)
    return where % n if low < 0 else where


def _item(batch: Any, k: int) -> Any:
    """Element ``k`` of a batch (an array, a tuple or a dict of arrays)."""
    if isinstance(batch, np.ndarray):
        return batch[k]
    if isinstance(batch, tuple):
        return tuple(_item(part, k) for part in batch)
    return {key: value[k] for key, value in batch.items()}


class GrainReader(PlanSource):
    """:meth:`grain_source` and :meth:`grain_batches`, methods of :class:`windowkit.Store`."""

    def grain_source(self, split: str = "train", *, normalize: bool = False,
                     return_series: bool = False, memory_budget: int | None = None,
                     spill_dir: str | os.PathLike[str] | None = None) -> WindowGrainSource:
        """A Grain random-access data source of the split's windows, a
        :class:`windowkit.readers.grain.WindowGrainSource`: ``src[i]`` is window
        ``i`` (``x``, ``(x, y)`` or a dict of fields, no batch axis), for
        ``grain.MapDataset.source(src).shuffle(seed=0).batch(B)``.

        :param split: the split to read.
        :param normalize: ``(x - mean) / std`` with the training rows' statistics.
        :param return_series: add each window's series id to ``x``.
        :param memory_budget: bytes of rows held in memory per process (default
            as for :meth:`tf_dataset`); beyond it they are spilled to local disk.
        :param spill_dir: as for :meth:`tf_dataset`.
        """
        batch = BatchOptions.checked(normalize=normalize, return_series=return_series)
        budget = check_budget("memory_budget", memory_budget)
        return WindowGrainSource(self.read_plan(split), normalize=batch.normalize,
                                 return_series=batch.return_series,
                                 memory_budget=default_memory_budget() if budget is None
                                 else budget, spill_dir=spill_dir)

    def grain_batches(self, split: str = "train", batch_size: int = 256, *,
                      shuffle: bool | str = True, seed: int = 0, epoch: int = 0, epochs: int = 1,
                      drop_remainder: bool = False, normalize: bool = False,
                      return_series: bool = False, memory_budget: int | None = None,
                      num_shards: int | None = None, shard_index: int | None = None,
                      spill_dir: str | os.PathLike[str] | None = None) -> BatchGrainSource:
        """A Grain random-access data source of whole batches, a
        :class:`windowkit.readers.grain.BatchGrainSource`: ``src[i]`` is batch
        ``i`` (NumPy: ``x``, ``(x, y)`` or a dict of fields), the same batch,
        window for window, as :meth:`keras_dataset`'s of that epoch; for
        ``grain.MapDataset.source(src)`` or ``grain.DataLoader(data_source=src,
        ...)``, which then neither shuffle nor batch again. The fast Grain
        source: Grain's cost per element is paid once a batch.

        Grain hands a source indices below its ``len`` only (its own repeats
        read the same items again), so the source holds ``epochs`` epochs one
        after another, each in its own seeded order: item ``i`` is batch
        ``i % src.batches_per_epoch`` of epoch ``epoch + i // src.batches_per_epoch``.

        :param split: the split to read.
        :param batch_size: windows per batch.
        :param shuffle: as for :meth:`tf_dataset`.
        :param seed: fixes every epoch's order.
        :param epoch: the epoch of the first item (to go on from a known epoch).
        :param epochs: how many epochs the source holds, one after another.
        :param drop_remainder: leave out the last, smaller batch of an epoch.
        :param normalize: ``(x - mean) / std`` with the training rows' statistics.
        :param return_series: add each window's series id to ``x``.
        :param memory_budget: as for :meth:`tf_dataset` (per process: Grain's
            worker processes each hold their own rows).
        :param num_shards: as for :meth:`tf_dataset`; give the Grain sampler
            ``grain.sharding.NoSharding()`` then (the source is the shard).
        :param shard_index: as for :meth:`tf_dataset`.
        :param spill_dir: as for :meth:`tf_dataset`.
        """
        batch = BatchOptions.checked(batch_size, drop_remainder=drop_remainder,
                                     normalize=normalize, return_series=return_series)
        order = ShuffleOptions.checked(shuffle, seed=seed, memory_budget=memory_budget,
                                       spill_dir=spill_dir)
        plan = self._shard_plan(split, ShardOptions.checked(num_shards, shard_index))
        return BatchGrainSource(EpochBatches(plan, batch, order),
                                epoch=check_int("epoch", epoch, 0),
                                epochs=check_int("epochs", epochs, 1))
