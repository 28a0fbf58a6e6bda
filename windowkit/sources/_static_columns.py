"""Static columns: one value per series (a sensor's height, a shop's size).

A table repeats a series' static values on each of its rows; staging keeps
one per series and refuses a row whose value is empty, not finite, or
differs from the series' first.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from windowkit.errors import SourceError
from windowkit.sources._row_locator import RowLocator, first_null


class StaticValues:
    """The current series' static values, checked on each of its rows."""

    def __init__(self, names: list[str], rows: RowLocator) -> None:
        self.names = names
        self.rows = rows
        self.current: np.ndarray | None = None  # NaN until the series' first row

    def start_series(self) -> None:
        """A new series starts: its values are not known yet."""
        self.current = np.full(len(self.names), np.nan)

    def values(self) -> tuple[float, ...]:
        """The current series' static values."""
        return tuple(float(v) for v in self.current) if self.current is not None else ()

    def check(self, batch: pa.RecordBatch, lo: int, hi: int, key: str) -> None:
        """Check that rows ``lo..hi`` (one series) hold the series' static values."""
        for k, column in enumerate(self.names):
            part = batch.column(column).slice(lo, hi - lo)
            if part.null_count:
                name, at = self.rows.in_batch(lo + first_null(part))
                raise SourceError(f"{name}: series {key!r}, row {at}, static column "
                                  f"{column!r} is empty")
            values = part.cast(pa.float64()).to_numpy(zero_copy_only=False)
            if not np.isfinite(values).all():
                name, at = self.rows.in_batch(lo + int(np.flatnonzero(
                    ~np.isfinite(values))[0]))
                raise SourceError(f"{name}: series {key!r}, row {at}, static column "
                                  f"{column!r} is NaN or infinite")
            assert self.current is not None
            if np.isnan(self.current[k]):
                self.current[k] = values[0]
            changed = np.flatnonzero(values != self.current[k])
            if len(changed):
                name, at = self.rows.in_batch(lo + int(changed[0]))
                raise SourceError(
                    f"{name}: series {key!r}, row {at}, static column {column!r}: "
                    f"{values[changed[0]]:g} differs from the series' {self.current[k]:g}"
                    "; a static column must hold one value per series")
