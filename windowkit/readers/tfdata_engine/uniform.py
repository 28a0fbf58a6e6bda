"""Uniform shuffling for ``tf.data``: each epoch a uniform permutation of the
split's windows, cut in the graph from rows held once.

The rows are held once (:class:`windowkit.readers.numpy_engine.held.HeldRows`:
in memory within ``memory_budget``, else spilled to a private file on local
disk and kept mapped). TensorFlow reads them where they are: each epoch, one
``numpy_function`` hands the held array over (no copy: the array is aligned
for TensorFlow, which keeps a reference), so no dataset holds a second copy
(a captured tensor would be copied into the dataset's graph by its rewrites).
Each chunk of ``CHUNK_BATCHES`` batches is one more ``numpy_function`` call
(:meth:`windowkit.readers.numpy_engine.batches.EpochBatches.held_positions_at`:
the keyed permutation, where each window starts in the held rows; small
arrays, so the interpreter lock is held briefly), and each batch is cut from
the rows by the same gathers as the block-group reader
(:class:`windowkit.readers.tfdata_engine.cut.WindowCutter`), in parallel,
outside the interpreter: a training loop in Python (Keras ``fit``) runs beside
it. Each iteration of the dataset reads the next epoch
(:mod:`windowkit.readers.tfdata_engine.epochs`), whose permutation is the one
every reader uses for that epoch; an iterator's position is a batch number,
so ``tf.train.Checkpoint`` saves it symbolically.

A store replaced while it is read (``convert --overwrite``) is
:class:`windowkit.errors.StoreReplacedError` at the next epoch at the latest,
never the held (or spilled) rows of the old one served on: the first chunk of
every epoch checks the store, whatever epoch number it reads (a distributed
dataset, or Keras ``fit`` without the epoch callback, reads the same one again).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from windowkit.readers.tfdata_engine.cut import PREFETCH_BATCHES, WindowCutter

if TYPE_CHECKING:
    import tensorflow as tf

    from windowkit.readers.numpy_engine.batches import EpochBatches

CHUNK_BATCHES = 16  # batches whose window positions one numpy_function call computes

MakeEpoch = Callable[["tf.Tensor"], "tf.data.Dataset"]  # an epoch -> its batches


def uniform_epochs(batches: EpochBatches) -> MakeEpoch:
    """A function from an epoch to its batches, as a ``tf.data.Dataset``, cut
    in the graph from the rows ``batches`` holds (held now)."""
    import tensorflow as tf

    batches.hold()
    rows = batches.held_rows().rows
    plan, batch_size = batches.plan, batches.batch_size
    norm = plan.store.normalizer() if batches.batch.normalize else None
    cutter = WindowCutter(plan.spec, norm, plan.store.target_positions, batches.fields)
    with_series = batches.fields.series
    chunk = CHUNK_BATCHES * batch_size
    total = batches.windows_per_epoch
    windows = batches.batches_per_epoch * batch_size if batches.batch.drop_remainder else total
    whole = batches.batch.drop_remainder or total % batch_size == 0  # every batch full
    guard = batches.plan.store.guard

    def held_rows(epoch: Any) -> np.ndarray:  # an input: else folded into a constant
        return batches.held_rows().rows

    def positions(epoch: Any, lo: Any) -> tuple[np.ndarray, np.ndarray]:
        if int(lo) == 0:  # an epoch's first chunk: a replaced store is an error
            guard.check()
        where = np.arange(int(lo), min(int(lo) + chunk, windows), dtype=np.int64)
        return batches.held_positions_at(int(epoch), where)

    def cut_chunk(lo: tf.Tensor, epoch: tf.Tensor) -> Any:
        # the held rows come in (no copy) and the chunk's windows go out within
        # one function. Stateless: a chunk depends only on (epoch, lo), so
        # symbolic checkpointing records the position alone
        held = tf.numpy_function(held_rows, [epoch], tf.as_dtype(rows.dtype), stateful=False)
        held.set_shape(rows.shape)
        at, series = tf.numpy_function(positions, [epoch, lo], [tf.int64, tf.int32],
                                       stateful=False)
        at.set_shape([None])
        series.set_shape([None])
        return tf.size(at, out_type=tf.int64), cutter(cutter.prepare(held, narrow=False), at,
                                                      series if with_series else None)

    def chunk_batches(size: tf.Tensor, windows_cut: Any) -> tf.data.Dataset:
        def batch_at(k: tf.Tensor) -> Any:
            part = tf.nest.map_structure(lambda t: t[k:k + batch_size], windows_cut)
            return _whole(part, batch_size) if whole else part

        return tf.data.Dataset.range(0, size, batch_size).map(batch_at)

    def one_epoch(epoch: tf.Tensor) -> tf.data.Dataset:
        chunks = tf.data.Dataset.range(0, windows, chunk)
        return chunks.map(lambda lo: cut_chunk(lo, epoch), num_parallel_calls=tf.data.AUTOTUNE,
                          deterministic=True).flat_map(chunk_batches)

    return one_epoch


def _whole(batch: Any, batch_size: int) -> Any:
    """``batch`` with its first dimension known: every batch is full."""
    import tensorflow as tf

    return tf.nest.map_structure(lambda t: tf.ensure_shape(t, [batch_size, *t.shape[1:]]),
                                 batch)


def uniform_dataset(batches: EpochBatches, epoch: int = 0) -> tf.data.Dataset:
    """Epoch ``epoch`` of ``batches``, as one dataset (benchmarks)."""
    import tensorflow as tf

    return uniform_epochs(batches)(tf.constant(epoch, tf.int64)).prefetch(PREFETCH_BATCHES)
