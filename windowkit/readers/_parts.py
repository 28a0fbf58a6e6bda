"""What a batch holds: ``x`` and ``y``, or, for forecasting models, a dict of parts.

Without known-future columns and without ``return_series``, a batch is ``x``
(``[B, L, ...]``), or ``(x, y)`` with a horizon. Otherwise ``x`` is a dict,
its keys named as a Keras functional model's inputs would be:

- ``inputs`` ``[B, L, F]``: the window's rows, every feature;
- ``future_known`` ``[B, H, K]``: the known-future columns over the horizon;
- ``static`` ``[B, S]``: the static features of the window's series;
- ``series`` ``[B]`` int32: the window's series (a row of ``series.parquet``),
  for an embedding (with static features, or ``return_series=True``).

``y`` stays ``[B, H, T]``. With ``normalize=True`` each part is normalized
with its own columns' training statistics (``series`` is an id, never).
:class:`BatchParts` assembles NumPy batches (the Keras reader, random access);
:func:`windowkit.readers._cut.window_cutter` does the same in the graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from windowkit.errors import StoreError
from windowkit.stats import Normalizer


@dataclass(frozen=True)
class BatchParts:
    """Which parts a batch holds besides its inputs and targets."""

    known: np.ndarray | None  # columns whose horizon values go to future_known
    series: bool  # each window's series id
    static: np.ndarray | None = None  # [series, S]: each series' static features
    static_stats: dict[str, Any] | None = None  # their training statistics
    static_dtype: str = "float32"  # float64 for float64 stores

    @property
    def as_dict(self) -> bool:
        return self.known is not None or self.series

    def static_table(self, normalize: bool) -> np.ndarray | None:
        """``[series, S]`` static values (normalized with their training
        statistics when asked), float32 (float64 for float64 stores)."""
        if self.static is None:
            return None
        if not normalize:
            return self.static.astype(self.static_dtype)
        if self.static_stats is None:
            raise StoreError("the store has no statistics of its static features (no "
                             "training series); normalize=True is refused")
        norm = Normalizer(self.static_stats, step_shape=(self.static.shape[1],),
                          dtype=np.dtype(self.static_dtype))
        return norm(self.static)

    def assemble(self, x: np.ndarray, y_all: np.ndarray | None, series: np.ndarray | None,
                 *, targets: np.ndarray | None, norm: Normalizer | None) -> Any:
        """A batch from its windows' inputs ``x``, their horizon rows ``y_all``
        (every column) and their series ids."""
        y = None if y_all is None else (y_all if targets is None else y_all[:, :, targets])
        if norm is not None:
            x = norm(x)
            y = None if y is None else norm.select(targets)(y)
        if not self.as_dict:
            return x if y is None else (x, y)
        parts: dict[str, np.ndarray] = {"inputs": x}
        if self.known is not None and y_all is not None:
            known = y_all[:, :, self.known]
            parts["future_known"] = known if norm is None else norm.select(self.known)(known)
        if self.static is not None and series is not None:
            table = self.static_table(norm is not None)
            assert table is not None
            parts["static"] = table[series]
        if self.series and series is not None:
            parts["series"] = np.asarray(series, dtype=np.int32)
        return parts if y is None else (parts, y)


def series_of(row_offset: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The series (int32) holding each global row in ``starts``."""
    return (np.searchsorted(row_offset, starts, side="right") - 1).astype(np.int32)
