"""A read plan: what a reader needs to read one split of a store, nothing more.

:meth:`windowkit.Store.read_plan` builds it from the (validated) manifest; the
``tf.data`` and Keras readers and ``windowkit bench`` take a plan, never the
store. A plan pickles (the split's windows travel in their compact form, as
runs), so worker processes read with it directly; its :class:`StoreGuard`
notices there if the store was replaced meanwhile.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from windowkit.errors import InvalidSpecError, StoreError, user_stacklevel
from windowkit.formats import RowReader, StorageFormat, get_format
from windowkit.formats.base import ReaderSetup
from windowkit.guard import StoreGuard
from windowkit.index import WindowRuns
from windowkit.layout import RowLayout
from windowkit.readers.epoch.order import block_first_positions
from windowkit.readers.epoch.shares import ShardShare
from windowkit.readers.fields import BatchFields
from windowkit.readers.options import BatchOptions, ShardOptions
from windowkit.readers.rows.pool import DEFAULT_CACHE_BYTES, WindowGather
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
    """One split of a store, as its readers see it: the store, and the windows
    the reader reads (``runs``). Sharded (:meth:`shard_of`), ``runs`` are the
    windows the shard owns, a contiguous piece of the split's index
    (:class:`ShardShare`), and ``split_runs`` all of the split's windows:
    each epoch's order is that of the whole split, restricted to the shard."""

    store: StoreAccess
    split: str
    runs: WindowRuns
    share: ShardShare | None = None
    split_runs: WindowRuns | None = None

    @property
    def spec(self) -> WindowSpec:
        return self.store.spec

    @property
    def layout(self) -> RowLayout:
        return self.store.layout

    @property
    def shard(self) -> tuple[int, int]:
        """``(shard_index, num_shards)``: ``(0, 1)`` for the whole split."""
        share = self.shard_share
        return share.index, share.count

    @property
    def shard_share(self) -> ShardShare:
        """Which windows of the split this plan owns (all of them unless sharded)."""
        return self.share if self.share is not None else ShardShare(0, 1, self.runs.total)

    @property
    def whole_split(self) -> WindowRuns:
        """Every window of the split (what each epoch's order permutes)."""
        return self.split_runs if self.split_runs is not None else self.runs

    @property
    def num_windows(self) -> int:
        """The windows this plan owns (the shard's share of the split)."""
        return self.runs.total

    def windows_per_epoch(self, drop_remainder: bool = False) -> int:
        """Windows an epoch yields: the plan's own, or sharded, as many as every
        other shard (see :meth:`ShardShare.windows_per_epoch`)."""
        return self.shard_share.windows_per_epoch(drop_remainder)

    def windows_per_block(self) -> np.ndarray:
        """How many of the plan's windows start in each storage block."""
        return np.diff(block_first_positions(self.runs, block_rows=self.layout.block_rows,
                                             num_blocks=self.layout.num_blocks))

    def split_windows_per_block(self) -> np.ndarray:
        """How many of the whole split's windows start in each storage block."""
        return np.diff(block_first_positions(self.whole_split, block_rows=self.layout.block_rows,
                                             num_blocks=self.layout.num_blocks))

    def rows_bytes(self) -> int:
        """Bytes of the rows the plan's windows need: the blocks where they start,
        each with its halo."""
        blocks = int(np.count_nonzero(self.windows_per_block()))
        return blocks * (self.layout.block_rows + self.spec.span - 1) * self.layout.row_bytes

    def shard_of(self, num_shards: int, shard_index: int) -> ReadPlan:
        """Shard ``shard_index`` of ``num_shards``: the windows at a contiguous
        piece of the split's index, the pieces' sizes within one window of each
        other, so that a shard reads only its own storage blocks (and at most
        one boundary block on each side). Any split with at least
        ``num_shards`` windows can be sharded; fewer is one line."""
        shard = ShardOptions.checked(num_shards, shard_index)
        if self.share is not None:
            raise InvalidSpecError("this plan is already a shard; shard the whole split")
        if shard.whole:
            return self
        share = ShardShare.of(self.runs.total, shard.num_shards, shard.shard_index,
                              where=f"{self.store.path}: split {self.split!r}")
        return replace(self, runs=self.runs.select_positions(share.lo, share.hi), share=share,
                       split_runs=self.runs)

    def warn_if_no_batch(self, batch: BatchOptions) -> None:
        """Warn (naming the split, its windows and the batch size) when
        ``drop_remainder`` leaves an epoch of this plan without a batch: a
        reader would yield nothing, and Keras ``fit`` would train (or
        validate) on nothing without a word."""
        windows = self.windows_per_epoch(batch.drop_remainder)
        if batch.drop_remainder and windows < batch.batch_size:
            share = self.shard_share
            where = f" (shard {share.index} of {share.count})" if share.count > 1 else ""
            warnings.warn(
                f"split {self.split!r}{where} has {windows} windows an epoch, fewer than one "
                f"batch of {batch.batch_size}: with drop_remainder=True an epoch yields no "
                "batch; lower batch_size or pass drop_remainder=False", UserWarning,
                stacklevel=user_stacklevel())


class PlanSource:
    """What a store's reader methods (``tf_dataset``, ``keras_dataset``,
    ``torch_dataset``, the Grain sources: each in its reader's module, mixed
    into :class:`windowkit.Store`) need of the store: a split's read plan."""

    def read_plan(self, split: str = "train") -> ReadPlan:
        raise NotImplementedError

    def _shard_plan(self, split: str, shard: ShardOptions) -> ReadPlan:
        """The plan of ``split``, or of one shard of it: a contiguous piece of
        the split's index, within one window of every other shard's."""
        return self.read_plan(split).shard_of(shard.num_shards, shard.shard_index)
