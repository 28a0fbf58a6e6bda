"""What a batch holds: ``x`` and ``y``, or, for forecasting models, a dict of fields.

Without known-future columns and without ``return_series``, a batch is ``x``
(``[B, L, ...]``), or ``(x, y)`` with a horizon. Otherwise ``x`` is a dict,
its keys named as a Keras functional model's inputs would be:

- ``inputs`` ``[B, L, F]``: the window's rows, every feature;
- ``future_known`` ``[B, H, K]``: the known-future columns over the horizon;
- ``static`` ``[B, S]``: the static features of the window's series;
- ``series`` ``[B]`` int32: the window's series (a row of ``series.parquet``),
  for an embedding (with static features, or ``return_series=True``).

``y`` stays ``[B, H, T]``. With ``normalize=True`` each field is normalized
with its own columns' training statistics (``series`` is an id, never).
:class:`BatchFields` assembles NumPy batches (the Keras reader, random access);
:func:`windowkit.readers.tfdata.cut.window_cutter` does the same in the graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from windowkit.errors import StoreError
from windowkit.stats import Normalizer


@dataclass(frozen=True)
class BatchFields:
    """Which fields a batch holds besides its inputs and targets."""

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
        return self._normalized_static if normalize else self._static

    @cached_property
    def _static(self) -> np.ndarray | None:
        return None if self.static is None else self.static.astype(self.static_dtype)

    @cached_property
    def _normalized_static(self) -> np.ndarray | None:
        if self.static is None:
            return None
        if self.static_stats is None:
            raise StoreError("the store has no statistics of its static features (no "
                             "training series); normalize=True is refused")
        norm = Normalizer(self.static_stats, step_shape=(self.static.shape[1],),
                          dtype=np.dtype(self.static_dtype))
        return norm(self.static)

    def horizon_columns(self, targets: np.ndarray | None) -> np.ndarray | None:
        """The columns to read over the horizon: the targets (None: every
        column), then the known-future columns, if any."""
        if self.known is None or targets is None:
            return targets
        return np.concatenate([targets, self.known])

    def assemble(self, x: np.ndarray, horizon: np.ndarray | None, series: np.ndarray | None,
                 *, targets: np.ndarray | None, norm: Normalizer | None) -> Any:
        """A batch from its windows' inputs ``x``, their horizon rows (the
        :meth:`horizon_columns`) and their series ids."""
        y, known = horizon, None
        if horizon is not None and self.known is not None:
            if targets is None:  # every column is a target; the known ones follow
                known = horizon[:, :, self.known]
            else:  # views, no copies
                y, known = horizon[:, :, :len(targets)], horizon[:, :, len(targets):]
        if norm is not None:
            x = norm(x)
            y = None if y is None else norm.select(targets)(y)
        if not self.as_dict:
            return x if y is None else (x, y)
        fields: dict[str, np.ndarray] = {"inputs": x}
        if known is not None:
            fields["future_known"] = known if norm is None else norm.select(self.known)(known)
        static = self.static_table(norm is not None)
        if static is not None and series is not None:
            fields["static"] = static[series]
        if self.series and series is not None:
            fields["series"] = np.asarray(series, dtype=np.int32)
        return fields if y is None else (fields, y)

