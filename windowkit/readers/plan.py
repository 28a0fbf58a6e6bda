"""A read plan: what a reader needs to read one split of a store, nothing more.

:meth:`windowkit.Store.read_plan` builds it from the (validated) manifest; the
``tf.data`` and Keras readers and ``windowkit bench`` take a plan, never the
store. A plan pickles (the split's windows travel in their compact form, as
runs), so worker processes read with it directly; its :class:`StoreGuard`
notices there if the store was replaced meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from windowkit.errors import InvalidSpecError, StoreError
from windowkit.formats import RowReader, StorageFormat, get_format
from windowkit.formats.base import ReaderSetup
from windowkit.guard import StoreGuard
from windowkit.index import WindowRuns
from windowkit.layout import RowLayout
from windowkit.readers.numpy_engine.fields import BatchFields
from windowkit.readers.numpy_engine.order import block_first_positions, dealt_share
from windowkit.readers.numpy_engine.pool import DEFAULT_CACHE_BYTES, WindowGather
from windowkit.readers.options import ShardOptions
from windowkit.spec import WindowSpec
from windowkit.stats import Normalizer


@dataclass(frozen=True)
class StoreAccess:
    """A store opened for reading: its rows and how to read them, and what
    cutting (and normalizing) windows from them needs, for any split."""

    path: Path  # where the store's files are (Manifest.data_root): the format's files
    format: str
    spec: WindowSpec
    layout: RowLayout
    data: dict[str, Any]  # the format's section of the manifest
    store_id: str
    statistics: dict[str, Any] | None  # training rows' per-column statistics
    target_positions: np.ndarray | None  # columns targets keep (None: all)
    known_positions: np.ndarray | None  # columns whose horizon values are known (future_known)
    static_values: np.ndarray | None  # [series, S] static features (float64)
    static_statistics: dict[str, Any] | None  # of the training series' static features
    guard: StoreGuard

    @property
    def storage(self) -> StorageFormat:
        return get_format(self.format)

    def reader_setup(self) -> ReaderSetup:
        """What a format's readers need besides the manifest's ``data`` section."""
        return ReaderSetup(rows=self.layout, span=self.spec.span,
                           check_store=self.guard.check, store_id=self.store_id)

    def row_reader(self) -> RowReader:
        """A new reader of the store's global rows (it opens files lazily)."""
        return self.storage.open_reader(self.path / "data", self.data, self.reader_setup())

    def window_gather(self, cache_bytes: int = DEFAULT_CACHE_BYTES) -> WindowGather:
        """A new gatherer with its own block cache of ``cache_bytes``."""
        return WindowGather(self.row_reader(), self.layout, spec=self.spec,
                            cache_bytes=cache_bytes, targets=self.target_positions)

    def normalizer(self) -> Normalizer:
        """``(x - mean) / std`` with the training rows' statistics."""
        if self.statistics is None:
            raise StoreError(f"{self.path}: store has no normalization statistics (no "
                             "training rows, or values whose statistics overflow float64)")
        return Normalizer(self.statistics, step_shape=self.layout.step_shape,
                          dtype=self.layout.dtype)

    def target_normalizer(self) -> Normalizer:
        """The normalizer of the target columns."""
        return self.normalizer().select(self.target_positions)

    def fields(self, return_series: bool) -> BatchFields:
        """What a batch holds besides inputs and targets (see :class:`BatchFields`)."""
        return BatchFields(known=self.known_positions,
                          series=bool(return_series) or self.static_values is not None,
                          static=self.static_values, static_stats=self.static_statistics,
                          static_dtype="float64" if self.layout.dtype == np.float64
                          else "float32")


@dataclass(frozen=True)
class ReadPlan:
    """One split of a store, as its readers see it: the store, and the split's
    windows (or, sharded, those of shard ``shard[0]`` of ``shard[1]``: its own
    storage blocks' windows, or with ``dealt``, its share of each epoch's
    uniform permutation of all the split's windows)."""

    store: StoreAccess
    split: str
    runs: WindowRuns
    shard: tuple[int, int] = (0, 1)
    dealt: bool = False

    @property
    def spec(self) -> WindowSpec:
        return self.store.spec

    @property
    def layout(self) -> RowLayout:
        return self.store.layout

    @property
    def num_windows(self) -> int:
        """The windows an epoch of this plan (this shard) holds."""
        return dealt_share(self.runs.total, self.shard) if self.dealt else self.runs.total

    def windows_per_block(self) -> np.ndarray:
        """How many of the plan's windows start in each storage block."""
        return np.diff(block_first_positions(self.runs, block_rows=self.layout.block_rows,
                                             num_blocks=self.layout.num_blocks))

    def rows_bytes(self) -> int:
        """Bytes of the rows the plan's windows need: the blocks where they start,
        each with its halo."""
        blocks = int(np.count_nonzero(self.windows_per_block()))
        return blocks * (self.layout.block_rows + self.spec.span - 1) * self.layout.row_bytes

    def _check_shard(self, num_shards: int, shard_index: int) -> tuple[int, int]:
        shard = ShardOptions.checked(num_shards, shard_index)
        if self.shard != (0, 1):
            raise InvalidSpecError("this plan is already a shard; shard the whole split")
        return shard.num_shards, shard.shard_index

    def dealt_shard(self, num_shards: int, shard_index: int) -> ReadPlan:
        """Shard ``shard_index`` of ``num_shards`` of a uniform shuffle: every
        ``num_shards``-th position of each epoch's permutation of the whole
        split, from ``shard_index`` on. Shards are disjoint, cover the split,
        and each is uniform; each reads any of the split's rows."""
        num_shards, shard_index = self._check_shard(num_shards, shard_index)
        if self.runs.total < num_shards:
            raise InvalidSpecError(
                f"{self.store.path}: split {self.split!r} has {self.runs.total} windows, too few "
                f"for {num_shards} shards (shard {shard_index} would hold none)")
        return replace(self, shard=(shard_index, num_shards), dealt=True)

    def sharded(self, num_shards: int, shard_index: int) -> ReadPlan:
        """Shard ``shard_index`` of ``num_shards``: the windows of its own storage
        blocks (a contiguous run of blocks holding, to within one block's windows,
        an even share), so that a shard reads only its blocks. Shards are disjoint and
        cover the plan's windows exactly once."""
        num_shards, shard_index = self._check_shard(num_shards, shard_index)
        if num_shards == 1:
            return self
        counts = self.windows_per_block()
        total = int(counts.sum())
        middle = 2 * np.cumsum(counts) - counts  # twice the position of a block's middle
        owner = np.minimum(middle * num_shards // max(1, 2 * total), num_shards - 1)
        mine = np.flatnonzero((owner == shard_index) & (counts > 0))
        if len(mine) == 0:
            raise InvalidSpecError(
                f"{self.store.path}: split {self.split!r} has {np.count_nonzero(counts)} storage "
                f"blocks holding windows, too few for {num_shards} shards (shard "
                f"{shard_index} would hold none)")
        block_rows, total_rows = self.layout.block_rows, self.layout.total_rows
        low = mine * block_rows
        runs = self.runs.select_rows(low, np.minimum(low + block_rows, total_rows))
        return replace(self, runs=runs, shard=(shard_index, num_shards))
