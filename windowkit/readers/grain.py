"""A Grain random-access data source of one split's windows.

``source[i]`` is window ``i`` of the split's index (``x``, ``(x, y)`` with a
horizon, or a dict of fields: the same structure as a batch of the other
readers, without the batch axis); Grain shuffles, batches, shards and
checkpoints::

    src = store.grain_source("train")
    ds = grain.MapDataset.source(src).shuffle(seed=0).batch(256)

It implements Grain's ``RandomAccessDataSource`` protocol (``__len__``,
``__getitem__``, a ``__repr__`` that names the store and split, for Grain's
checkpoints) and its batched read ``_getitems``: one NumPy gather for many
windows, which Grain uses where it batches reads.

The split's rows are held once per process, on first use (in memory within
``memory_budget``, else spilled to a private file on local disk, as a uniform
shuffle holds them): every window is then one contiguous row range, read in
any order. The source pickles as its read plan and arguments, so Grain's
worker processes work with it.

A store replaced while it is read (``convert --overwrite``) is
:class:`windowkit.errors.StoreReplacedError`, never its old rows served on:
a Grain source has no epochs, so it checks the store (a ``stat`` of its
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

from windowkit.readers.numpy_engine.held import HeldRows

if TYPE_CHECKING:
    from windowkit.readers.numpy_engine.fields import BatchFields
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


def _index(value: object) -> int:
    """``value`` as a window index: an integer (Python or NumPy), not a bool."""
    if not isinstance(value, bool | np.bool_):
        try:
            return operator.index(value)  # type: ignore[arg-type]
        except TypeError:
            pass
    raise TypeError(f"window indices are integers, got {value!r} "
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
