"""Cutting windows from rows in the graph: one window copy per batch
(:func:`windowkit.native.window_copy`; every ``tf.data`` pipeline uses it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from windowkit.native import window_copy
from windowkit.readers.fields import BatchFields
from windowkit.readers.windows import window_row_offsets
from windowkit.spec import WindowSpec
from windowkit.stats import Normalizer

if TYPE_CHECKING:
    import tensorflow as tf

PREFETCH_BATCHES = 8  # batches of block groups ahead (autotuned: ~35 MB more, no gain)


class WindowCutter:
    """Cuts batches of windows from rows in the graph, one window copy per part
    (``native=False``: one ``tf.gather``, for graphs run where windowkit's op
    is not loaded, such as remote tf.data service workers).

    ``prepare(rows)`` runs once per tensor of rows (a group of blocks): it keeps
    the horizon's columns (the targets, then the known-future columns) as one
    narrow row tensor, so that one gather reads a batch's whole horizon (the
    gather's cost is per slice: a second, narrower gather for the known columns
    cost more than splitting one). ``cutter(prepared, starts, series)`` is the
    batch of the windows starting at ``starts``: ``x``, ``(x, y)``, or with
    fields a dict ``x`` (see :mod:`windowkit.readers.fields`), normalized when
    asked; ``y`` keeps the ``targets`` columns (None: all)."""

    def __init__(self, spec: WindowSpec, norm: Normalizer | None,
                 targets: np.ndarray | None = None, fields: BatchFields | None = None, *,
                 native: bool = True) -> None:
        inputs, horizon = window_row_offsets(spec)  # the NumPy readers' offsets too
        self._inputs, self._horizon = inputs, horizon if spec.horizon else None
        self._step, self._native = spec.sampling_rate, native
        self._norm, self._targets, self._parts = norm, targets, fields
        self._known = fields.known if fields is not None else None
        self._horizon_columns = targets if fields is None else fields.horizon_columns(targets)
        self._static = fields.static_table(norm is not None) if fields is not None else None

    def prepare(self, rows: tf.Tensor, *, narrow: bool = True) -> tuple[tf.Tensor, ...]:
        """``(rows, horizon rows)``: the horizon's columns only where they are
        not every column; ``narrow=False``: ``(rows,)``, no copy (each batch
        picks its columns)."""
        if self._horizon is None or not narrow:
            return (rows,)
        columns = self._horizon_columns
        return rows, rows if columns is None else _columns(rows, columns)

    def _normalized(self, values: tf.Tensor, columns: np.ndarray | None) -> tf.Tensor:
        import tensorflow as tf

        if self._norm is None:
            return values
        chosen = self._norm.select(columns)
        return (tf.cast(values, chosen.mean.dtype) - chosen.mean) * chosen.scale

    def _windows(self, rows: tf.Tensor, starts: tf.Tensor, offsets: np.ndarray) -> tf.Tensor:
        """``rows[starts[:, None] + offsets]`` (``offsets``: the window's inputs
        or horizon rows, evenly spaced by the sampling rate)."""
        first = int(offsets[0]) if len(offsets) else 0
        return window_copy(rows, starts + first, len(offsets), self._step, compiled=self._native)

    def _horizon_parts(self, prepared: tuple[tf.Tensor, ...], starts: tf.Tensor
                       ) -> tuple[tf.Tensor, tf.Tensor | None]:
        """The batch's targets ``[B, H, T]`` and known-future values ``[B, H, K]``
        (None without known columns), from one copy of its horizon rows."""
        import tensorflow as tf

        assert self._horizon is not None  # called for a spec with a horizon
        horizon = self._windows(prepared[-1], starts, self._horizon)
        known, targets = self._known, self._targets
        if len(prepared) == 1 or targets is None:  # every column: pick the fields
            y = horizon if targets is None else tf.gather(horizon, targets, axis=2)
            return y, None if known is None else tf.gather(horizon, known, axis=2)
        if known is None:  # the narrow rows are the targets' columns
            return horizon, None
        y, future = tf.split(horizon, [len(targets), len(known)], axis=2)  # targets, then known
        return y, future

    def __call__(self, prepared: tuple[tf.Tensor, ...], starts: tf.Tensor,
                 series: tf.Tensor | None = None) -> Any:
        import tensorflow as tf

        x = self._normalized(self._windows(prepared[0], starts, self._inputs), None)
        y = future = None
        if self._horizon is not None:
            y, future = self._horizon_parts(prepared, starts)
            y = self._normalized(y, self._targets)
        fields = self._parts
        if fields is None or not fields.as_dict:
            return x if y is None else (x, y)
        out = {"inputs": x}
        if future is not None:
            out["future_known"] = self._normalized(future, self._known)
        if self._static is not None and series is not None:
            out["static"] = tf.gather(self._static, series)
        if fields.series and series is not None:
            out["series"] = tf.cast(series, tf.int32)
        return out if y is None else (out, y)


def full_batch(batch: Any, batch_size: int) -> Any:
    """``batch`` with its first dimension known: a batch that is always full."""
    import tensorflow as tf

    return tf.nest.map_structure(lambda t: tf.ensure_shape(t, [batch_size, *t.shape[1:]]),
                                 batch)


def inline_map(ds: tf.data.Dataset, function: Callable[..., Any]) -> tf.data.Dataset:
    """``ds.map(function)``, the function run in the thread that asks for the
    element, not handed to TensorFlow's thread pool each time: for a light
    function per batch (slicing a batch out of a chunk), whose hand-over cost
    more CPU than the function (measured: 13% of ``tf_dataset``'s CPU)."""
    try:
        from tensorflow.python.data.ops import map_op

        return map_op._MapDataset(ds, function, use_inter_op_parallelism=False,
                                  preserve_cardinality=True)
    except (ImportError, AttributeError, TypeError):  # another TensorFlow's internals
        return ds.map(function)


def _columns(rows: tf.Tensor, columns: np.ndarray) -> tf.Tensor:
    """``rows[:, columns]``: a slice (a faster copy) when the columns are a run,
    else a gather."""
    import tensorflow as tf

    first = int(columns[0]) if len(columns) else 0
    if np.array_equal(columns, np.arange(first, first + len(columns))):
        return rows[:, first:first + len(columns)]
    return tf.gather(rows, columns, axis=1)


def window_cutter(spec: WindowSpec, norm: Normalizer | None,
                  targets: np.ndarray | None = None, fields: BatchFields | None = None, *,
                  native: bool = True) -> Callable[..., Any]:
    """``cut(rows, starts, series=None)``: :class:`WindowCutter` for rows cut
    from once (``prepare`` on every call)."""
    cutter = WindowCutter(spec, norm, targets, fields, native=native)
    return lambda rows, starts, series=None: cutter(cutter.prepare(rows), starts, series)
