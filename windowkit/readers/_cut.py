"""Cutting windows from rows in the graph: one ``tf.gather`` per batch (both
``tf.data`` pipelines, block groups and global, use it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from windowkit.spec import WindowSpec
from windowkit.stats import Normalizer
from windowkit.windows import window_row_offsets

if TYPE_CHECKING:
    import tensorflow as tf

PREFETCH_BATCHES = 8  # an autotuned buffer grew by ~35 MB here and gained nothing


def window_cutter(spec: WindowSpec, norm: Normalizer | None,
                  targets: np.ndarray | None = None) -> Callable[[tf.Tensor, tf.Tensor], Any]:
    """``cut(rows, starts)``: the batch of windows starting at ``starts`` in
    ``rows``, one ``tf.gather`` (normalized when asked); targets keep the
    ``targets`` columns only (None: all)."""
    import tensorflow as tf

    inputs, horizon = window_row_offsets(spec)  # the NumPy readers' offsets too
    input_offsets = tf.constant(inputs, dtype=tf.int64)
    target_offsets = tf.constant(horizon, dtype=tf.int64)

    def cut_batch(rows: tf.Tensor, starts: tf.Tensor) -> Any:
        x = tf.gather(rows, starts[:, None] + input_offsets)
        y = tf.gather(rows, starts[:, None] + target_offsets) if spec.horizon else None
        if y is not None and targets is not None:
            y = tf.gather(y, targets, axis=2)
        if norm is not None:
            mean, scale = tf.constant(norm.mean), tf.constant(norm.scale)
            x = (tf.cast(x, mean.dtype) - mean) * scale
            if y is not None:
                y_norm = norm.select(targets)
                y = (tf.cast(y, mean.dtype) - y_norm.mean) * y_norm.scale
        return x if y is None else (x, y)

    return cut_batch
