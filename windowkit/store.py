"""An opened store: metadata, window index, random access and readers."""

from __future__ import annotations

import os
import threading
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from windowkit.errors import InvalidSpecError, StoreReplacedError
from windowkit.formats import RowReader
from windowkit.guard import StoreGuard
from windowkit.index import IndexLimits, WindowRuns, index_positions
from windowkit.layout import RowLayout
from windowkit.location import resolve
from windowkit.manifest import Manifest, SplitEntry, Statistics
from windowkit.readers import DEFAULT_CACHE_BYTES, ReadPlan, StoreAccess, WindowGather
from windowkit.readers.grain import GrainReader
from windowkit.readers.keras import KerasReader
from windowkit.readers.tf import TfDatasetReader
from windowkit.readers.torch import TorchReader
from windowkit.series_table import SeriesTable
from windowkit.spec import WindowSpec
from windowkit.split_index import SplitIndexes
from windowkit.stats import Normalizer

Windows = Any  # x, (x, y), or with fields a dict x: see windowkit.readers.fields


def open_store(path: str | os.PathLike[str], *,
               storage_options: dict[str, Any] | None = None) -> Store:
    """Open a store of any format: a local directory, or a URL fsspec
    understands (``s3://bucket/store``; ``storage_options`` go to its
    filesystem, as in pandas and zarr).

    The store is read as untrusted input: its manifest is validated first
    (types, ranges, paths inside the store, each file leading to a regular
    file: links are followed, every block checked against its digest), and
    opening never writes."""
    return Store(resolve(path, storage_options))


class Store(TfDatasetReader, KerasReader, TorchReader, GrainReader):
    """A windowkit store on disk. Cheap to open; pickles (no open handles).

    Its readers (:meth:`tf_dataset`, :meth:`keras_dataset`,
    :meth:`torch_dataset`, :meth:`grain_source`, :meth:`grain_batches`) are
    methods it takes from each reader's module, which documents their options.

    Readers notice when the store is replaced while they read it (e.g. by
    ``convert --overwrite``) and raise :class:`windowkit.StoreReplacedError`,
    in this process and in worker processes, which check the store id when
    they open it again.
    """

    def __init__(self, path: Path, *, expected_id: str | None = None) -> None:
        self.path = resolve(path)
        self.manifest = Manifest.read(self.path)
        if expected_id is not None and self.manifest.store_id != expected_id:
            raise StoreReplacedError(
                f"{self.path}: the store was replaced while it was being read (opened as "
                f"store id {expected_id[:12]}, now {self.manifest.store_id[:12]}); "
                "open it again")
        self.root = self.manifest.data_root(self.path)  # where its files are
        self.guard = StoreGuard(self.path, self.manifest.store_id)
        self._lock = threading.Lock()
        self._gather: WindowGather | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "store_id": self.manifest.store_id}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], expected_id=state["store_id"])  # type: ignore[misc]

    def __repr__(self) -> str:
        m = self.manifest
        return (f"<windowkit.Store {str(self.path)!r} format={m.format} dtype={m.dtype} "
                f"step_shape={m.step_shape} splits={self.splits}>")

    # -- metadata ---------------------------------------------------------------------
    @property
    def info(self) -> dict[str, Any]:
        """The manifest as a plain dict."""
        return self.manifest.to_dict()

    @property
    def spec(self) -> WindowSpec:
        return self.manifest.spec

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.manifest.dtype)

    @property
    def step_shape(self) -> tuple[int, ...]:
        return self.manifest.step_shape

    def _positions(self, names: list[str] | None) -> np.ndarray | None:
        """Positions of the columns ``names`` among the store's columns (None: none)."""
        columns = self.manifest.columns
        if not names or not columns:
            return None
        return np.array([columns.index(name) for name in names], dtype=np.int64)

    @cached_property
    def target_positions(self) -> np.ndarray | None:
        """Positions of the target columns among the columns (None: y has every column)."""
        return self._positions(self.manifest.target_columns)

    @cached_property
    def known_positions(self) -> np.ndarray | None:
        """Positions of the known-future columns among the columns (None: none)."""
        return self._positions(self.manifest.known_columns)

    @cached_property
    def static_values(self) -> np.ndarray | None:
        """``[series, S]`` float64: each series' static features (None: none)."""
        return self._series.static_values()

    @property
    def splits(self) -> list[str]:
        return list(self.manifest.splits)

    def _split(self, split: str) -> SplitEntry:
        if split not in self.manifest.splits:
            raise InvalidSpecError(
                f"split {split!r} is not in store {self.path}; splits: {', '.join(self.splits)}"
            )
        return self.manifest.splits[split]

    def num_windows(self, split: str = "train") -> int:
        return self._split(split).windows

    @cached_property
    def _series(self) -> SeriesTable:
        return SeriesTable(self.root, self.manifest, self.guard)

    @property
    def series_table(self) -> Any:
        """``series.parquet`` as a pyarrow Table (one row per series: ``series``,
        ``key``, ``rows``, ``row_offset``, ``windows``, each split's row range
        and the static features), checked against the manifest."""
        return self._series.table

    def split_rows(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        """Per series, the first row and the end of the rows the windows of
        ``split`` lie in (``series.parquet``)."""
        self._split(split)
        return self._series.split_rows(split)

    # -- the window index -------------------------------------------------------------
    @cached_property
    def _indexes(self) -> SplitIndexes:
        return SplitIndexes(self.root, self.manifest, self._series, self.guard)

    def index(self, split: str = "train") -> np.ndarray:
        """The split's window index table as an ``[n, 3]`` int64 array
        ``(series, start, length)``, each entry checked. This loads one entry
        per window; readers use :meth:`runs`."""
        self._split(split)
        return self._indexes.table(split)

    def index_limits(self, split: str) -> IndexLimits:
        """What each entry of ``split``'s index table must satisfy (see
        :class:`windowkit.index.IndexLimits`)."""
        self._split(split)
        return self._indexes.limits(split)

    def runs(self, split: str = "train") -> WindowRuns:
        """The split's windows in compact form (memory grows with series, not
        windows), each index entry checked."""
        self._split(split)
        return self._indexes.runs(split)

    # -- reading windows --------------------------------------------------------------
    @cached_property
    def layout(self) -> RowLayout:
        """The stored rows: dtype, step shape, count and storage blocks."""
        return self.manifest.layout

    @cached_property
    def access(self) -> StoreAccess:
        """The store opened for reading (what every reader starts from)."""
        m = self.manifest
        return StoreAccess(path=self.root, format=m.format, spec=self.spec, layout=self.layout,
                           data=m.data, store_id=m.store_id, statistics=_as_dict(m.normalization),
                           target_positions=self.target_positions,
                           known_positions=self.known_positions, static_values=self.static_values,
                           static_statistics=_as_dict(m.static_statistics), guard=self.guard)

    def read_plan(self, split: str = "train") -> ReadPlan:
        """What a reader needs to read ``split``: the rows and the split's windows
        (a split holding none is an error: a reader would yield nothing)."""
        if self.num_windows(split) == 0:
            raise InvalidSpecError(f"split {split!r} of store {self.path} holds no windows, "
                                   "so there is nothing to read (see windowkit inspect)")
        return ReadPlan(self.access, split=split, runs=self.runs(split))

    def row_reader(self) -> RowReader:
        return self.access.row_reader()

    def window_gather(self, cache_bytes: int = DEFAULT_CACHE_BYTES) -> WindowGather:
        """A new gatherer with its own block cache of ``cache_bytes``."""
        return self.access.window_gather(cache_bytes)

    def normalizer(self) -> Normalizer:
        return self.access.normalizer()

    def windows(self, split: str, positions: Any, *, normalize: bool = False,
                return_series: bool = False) -> Windows:
        """Windows at ``positions`` of the split's index (random access): ``x`` or,
        with a horizon, ``(x, y)``; ``x`` is a dict of fields (``inputs``,
        ``future_known``, ``static``, ``series``) when the store has known-future
        or static columns, or ``return_series`` (see
        :mod:`windowkit.readers.fields`). ``positions`` index as
        NumPy indexes: integers (negative from the end), a slice or a boolean
        mask; anything else is one line."""
        self._split(split)
        runs = self.runs(split)
        starts, series = runs.global_starts_and_series(index_positions(positions, runs.total))
        with self._lock:
            if self._gather is None:
                self._gather = self.window_gather()
            gather = self._gather
        fields = self.access.fields(return_series)
        x, horizon = gather.cut(starts, fields.horizon_columns(self.target_positions))
        return fields.assemble(x, horizon, series if fields.series else None,
                              targets=self.target_positions,
                              norm=self.access.normalizer() if normalize else None)


def _as_dict(stats: Statistics | None) -> dict[str, Any] | None:
    return None if stats is None else stats.model_dump()
