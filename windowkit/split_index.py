"""Each split's window index of a store, read once and checked entry by entry.

A split's index table (``index/<split>.parquet``: one ``(series, start,
length)`` entry per window) is untrusted input: every entry must lie inside
the split's rows of its series and on the series' stride grid
(:class:`windowkit.index.IndexLimits`), and the count must be the manifest's.
Readers use it in compact form (:class:`windowkit.index.WindowRuns`).
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from windowkit.errors import StoreError
from windowkit.guard import StoreGuard
from windowkit.index import IndexLimits, WindowRuns, iter_index, read_window_runs
from windowkit.manifest import Manifest
from windowkit.series_table import SeriesTable


class SplitIndexes:
    """The window indexes of the store whose files are under ``root``
    (``split`` must be one of the manifest's splits)."""

    def __init__(self, root: Path, manifest: Manifest, series: SeriesTable,
                 guard: StoreGuard) -> None:
        self._root = root
        self._manifest = manifest
        self._series = series
        self._guard = guard
        self._lock = threading.Lock()
        self._runs: dict[str, WindowRuns] = {}

    def _path(self, split: str) -> Path:
        return self._root / self._manifest.splits[split].index

    def table(self, split: str) -> np.ndarray:
        """The index as an ``[n, 3]`` int64 array ``(series, start, length)``,
        each entry checked (:meth:`runs`); one entry per window in memory."""
        self.runs(split)
        parts = [np.column_stack([b.column(i).to_numpy() for i in range(3)]).astype(np.int64)
                 for b in iter_index(self._path(split))]
        return np.concatenate(parts) if parts else np.empty((0, 3), dtype=np.int64)

    def limits(self, split: str) -> IndexLimits:
        """What each entry must satisfy: inside the split's rows, on the grid."""
        first, end = self._series.split_rows(split)
        spec = self._manifest.spec
        return IndexLimits(self._series.int_column("rows"), first=first, end=end,
                           span=spec.span, length=spec.length, stride=spec.stride)

    def runs(self, split: str) -> WindowRuns:
        """The split's windows in compact form (memory grows with series, not
        windows), each entry checked, read once."""
        with self._lock:
            if split not in self._runs:
                runs = read_window_runs(
                    self._path(split), stride=self._manifest.spec.stride,
                    row_offset=self._series.int_column("row_offset"),
                    limits=self.limits(split))
                self._guard.check()
                expected = self._manifest.splits[split].windows
                if runs.total != expected:
                    raise StoreError(f"{self._path(split)}: the index of split {split!r} "
                                     f"holds {runs.total} windows, the manifest says "
                                     f"{expected}")
                self._runs[split] = runs
            return self._runs[split]
