"""A read plan: what a reader needs to read one split of a store, nothing more.

:meth:`windowkit.Store.read_plan` builds it from the (validated) manifest; the
``tf.data`` and Keras readers and ``windowkit bench`` take a plan, never the
store. A plan pickles (the split's windows travel in their compact form, as
runs), so worker processes read with it directly; its :class:`StoreGuard`
notices there if the store was replaced meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from windowkit.errors import StoreError
from windowkit.formats import RowReader, StorageFormat, get_format
from windowkit.formats.base import ReaderSetup
from windowkit.index import WindowRuns
from windowkit.manifest import StoreGuard
from windowkit.readers._gather import DEFAULT_CACHE_BYTES, WindowGather
from windowkit.spec import WindowSpec
from windowkit.stats import Normalizer


@dataclass(frozen=True)
class StoreRows:
    """A store's rows and how to read them and cut windows from them (any split)."""

    path: Path  # the store: for messages, and the format's own files
    format: str
    spec: WindowSpec
    dtype: np.dtype
    step_shape: tuple[int, ...]
    total_rows: int
    block_rows: int
    data: dict[str, Any]  # the format's section of the manifest
    store_id: str
    statistics: dict[str, Any] | None  # training rows' per-column statistics
    target_index: np.ndarray | None  # columns targets keep (None: all)
    guard: StoreGuard

    @property
    def storage(self) -> StorageFormat:
        return get_format(self.format)

    @property
    def row_bytes(self) -> int:
        return self.dtype.itemsize * int(np.prod(self.step_shape, dtype=np.int64))

    def row_reader(self) -> RowReader:
        """A new reader of the store's global rows (it opens files lazily)."""
        setup = ReaderSetup(dtype=self.dtype, step_shape=self.step_shape,
                            block_rows=self.block_rows, total_rows=self.total_rows,
                            span=self.spec.span, check_store=self.guard.check,
                            store_id=self.store_id)
        return self.storage.open_reader(self.path / "data", self.data, setup)

    def window_gather(self, cache_bytes: int = DEFAULT_CACHE_BYTES) -> WindowGather:
        """A new gatherer with its own block cache of ``cache_bytes``."""
        return WindowGather(self.row_reader(), spec=self.spec, total_rows=self.total_rows,
                            step_shape=self.step_shape, dtype=self.dtype,
                            cache_bytes=cache_bytes, targets=self.target_index)

    def normalizer(self) -> Normalizer:
        """``(x - mean) / std`` with the training rows' statistics."""
        if self.statistics is None:
            raise StoreError(f"{self.path}: store has no normalization statistics (no "
                             "training rows, or values whose statistics overflow float64)")
        return Normalizer(self.statistics, step_shape=self.step_shape, dtype=self.dtype)

    def target_normalizer(self) -> Normalizer:
        """The normalizer of the target columns."""
        return self.normalizer().select(self.target_index)


@dataclass(frozen=True)
class ReadPlan(StoreRows):
    """One split of a store, as its readers see it: the rows, and the split's windows."""

    split: str
    runs: WindowRuns

    @property
    def num_windows(self) -> int:
        return self.runs.total
