"""Uniform shuffling for ``tf.data``: each epoch a uniform permutation of the
split's windows, cut in the graph from rows held once.

The rows are held once (:class:`windowkit.readers.rows.held.HeldRows`:
in memory within ``memory_budget``, else spilled to a private file on local
disk and kept mapped). TensorFlow reads them where they are: each epoch, one
``numpy_function`` hands the held array over (no copy: the array is aligned
for TensorFlow, which keeps a reference), so no dataset holds a second copy
(a captured tensor would be copied into the dataset's graph by its rewrites).
Each chunk of batches (:func:`chunk_batches`) is cut at once, in parallel and
outside the interpreter (a training loop in Python, Keras ``fit``, runs
beside it): where its windows start in the held rows (the epoch's keyed
permutation, compiled for a whole split,
:func:`windowkit.native.epoch_starts`; for a shard, one ``numpy_function``
call, :meth:`windowkit.readers.epoch.batches.EpochBatches.held_positions_at`:
small arrays, so the interpreter lock is held briefly), then one window copy
(:class:`windowkit.readers.tfdata.cut.WindowCutter`, compiled:
:func:`windowkit.native.window_copy`); ``CHUNKS_AHEAD`` chunks are cut at
once. Batches are slices of a chunk (no copy), sliced in the thread that asks
for them; the reader's autotuned ``prefetch`` keeps them ahead of the
consumer.
Each iteration of the dataset reads the next epoch
(:mod:`windowkit.readers.tfdata.epochs`), whose permutation is the one every
reader uses for that epoch; an iterator's position is a batch number, so
``tf.train.Checkpoint`` saves it symbolically.

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

from windowkit.native import epoch_starts
from windowkit.readers.epoch.permutation import tf_permute
from windowkit.readers.epoch.sampler import uniform_key
from windowkit.readers.tfdata.cut import WindowCutter, full_batch, inline_map

if TYPE_CHECKING:
    import tensorflow as tf

    from windowkit.readers.epoch.batches import EpochBatches

CHUNK_BATCHES = 16  # batches cut at once (and, for a shard, one numpy_function call) ...
CHUNK_BYTES = 8 << 20  # ... fewer where 16 batches would be more bytes than this
CHUNKS_AHEAD = 2  # chunks cut at once, ahead of the consumer (about 2x this many held)

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
    chunk = chunk_batches(plan.spec.steps * plan.layout.row_bytes * batch_size) * batch_size
    total = batches.windows_per_epoch
    windows = batches.batches_per_epoch * batch_size if batches.batch.drop_remainder else total
    whole = batches.batch.drop_remainder or total % batch_size == 0  # every batch full
    where = _GraphPositions(batches) if plan.shard_share.whole else _PythonPositions(batches)

    def held(epoch: Any) -> tuple[np.ndarray, np.uint64]:  # once an epoch
        batches.plan.store.guard.check()  # a replaced store is an error
        return batches.held_rows().rows, np.uint64(uniform_key(batches.order.seed,
                                                                int(epoch)))

    def cut_chunk(lo: tf.Tensor, epoch: tf.Tensor, rows_in: tf.Tensor, key: tf.Tensor) -> Any:
        at, series = where(epoch, key, lo, tf.minimum(lo + chunk, windows))
        return tf.size(at, out_type=tf.int64), cutter(cutter.prepare(rows_in, narrow=False), at,
                                                      series if with_series else None)

    def sliced_batches(size: tf.Tensor, windows_cut: Any) -> tf.data.Dataset:
        def batch_at(k: tf.Tensor) -> Any:
            part = tf.nest.map_structure(lambda t: t[k:k + batch_size], windows_cut)
            return full_batch(part, batch_size) if whole else part

        return inline_map(tf.data.Dataset.range(0, size, batch_size), batch_at)

    def one_epoch(epoch: tf.Tensor) -> tf.data.Dataset:
        # the held rows come in without a copy (an input keeps the call from
        # being folded into a constant, which would be one); stateless: what an
        # epoch reads depends only on its number, so symbolic checkpointing
        # records a position and nothing else
        rows_in, key = tf.numpy_function(held, [epoch], [tf.as_dtype(rows.dtype), tf.uint64],
                                         stateful=False)
        rows_in.set_shape(rows.shape)
        key.set_shape([])
        chunks = tf.data.Dataset.range(0, windows, chunk)
        return chunks.map(lambda lo: cut_chunk(lo, epoch, rows_in, key),
                          num_parallel_calls=CHUNKS_AHEAD, deterministic=True
                          ).flat_map(sliced_batches)

    return one_epoch


def chunk_batches(batch_bytes: int) -> int:
    """Batches cut at once: ``CHUNK_BATCHES``, fewer for batches of over
    ``CHUNK_BYTES / CHUNK_BATCHES`` bytes (at least one)."""
    return max(1, min(CHUNK_BATCHES, CHUNK_BYTES // max(1, batch_bytes)))


class _GraphPositions:
    """Where the windows at epoch positions ``[lo, hi)`` start in the held
    rows, and their series, computed in the graph (no Python while an epoch
    is read: a training loop in Python never waits on the interpreter lock
    for it): the epoch's keyed permutation (the NumPy readers' numbers), the
    runs of the index, the blocks' places in the held rows, in one compiled
    op (:func:`windowkit.native.epoch_starts`), else in TensorFlow's ops
    (:func:`windowkit.readers.epoch.permutation.tf_permute`). For a whole
    split; a shard's order is :class:`_PythonPositions`'."""

    def __init__(self, batches: EpochBatches) -> None:
        import tensorflow as tf

        runs, held = batches.plan.whole_split, batches.held_rows()
        self._total, self._stride = int(runs.total), int(runs.stride)
        self._block_rows = int(held.block_rows)
        self._run_first = tf.constant(runs.cumulative[:-1], tf.int64)
        self._run_start = tf.constant(runs.global_first, tf.int64)
        self._run_series = tf.constant(runs.series, tf.int32)
        self._block_base = tf.constant(held.block_base, tf.int64)

    def __call__(self, epoch: tf.Tensor, key: tf.Tensor, lo: tf.Tensor, hi: tf.Tensor
                 ) -> tuple[tf.Tensor, tf.Tensor]:
        compiled = epoch_starts(lo, hi, key, size=self._total, run_first=self._run_first,
                                run_start=self._run_start, run_series=self._run_series,
                                stride=self._stride, block_base=self._block_base,
                                block_rows=self._block_rows)
        return compiled if compiled is not None else self._in_graph(key, lo, hi)

    def _in_graph(self, key: tf.Tensor, lo: tf.Tensor, hi: tf.Tensor
                  ) -> tuple[tf.Tensor, tf.Tensor]:
        import tensorflow as tf

        positions = tf_permute(tf.range(lo, hi), self._total, key)
        run = tf.searchsorted(self._run_first, positions, side="right", out_type=tf.int64) - 1
        starts = (tf.gather(self._run_start, run)
                  + (positions - tf.gather(self._run_first, run)) * self._stride)
        block = starts // self._block_rows
        at = tf.gather(self._block_base, block) + starts - block * self._block_rows
        return at, tf.gather(self._run_series, run)


class _PythonPositions:
    """:class:`_GraphPositions` for a shard: one ``numpy_function`` call per
    chunk (:meth:`windowkit.readers.epoch.batches.EpochBatches.held_positions_at`:
    a shard's piece of the epoch's order, padded; small arrays, the
    interpreter lock held briefly; a spill's pages asked for ahead)."""

    def __init__(self, batches: EpochBatches) -> None:
        self.batches = batches

    def _positions(self, epoch: Any, lo: Any, hi: Any) -> tuple[np.ndarray, np.ndarray]:
        where = np.arange(int(lo), int(hi), dtype=np.int64)
        return self.batches.held_positions_at(int(epoch), where)

    def __call__(self, epoch: tf.Tensor, key: tf.Tensor, lo: tf.Tensor, hi: tf.Tensor
                 ) -> tuple[tf.Tensor, tf.Tensor]:
        import tensorflow as tf

        at, series = tf.numpy_function(self._positions, [epoch, lo, hi], [tf.int64, tf.int32],
                                       stateful=False)
        at.set_shape([None])
        series.set_shape([None])
        return at, series


def uniform_dataset(batches: EpochBatches, epoch: int = 0) -> tf.data.Dataset:
    """Epoch ``epoch`` of ``batches``, as one dataset (benchmarks)."""
    import tensorflow as tf

    # the epoch as an element, not a constant: a constant would fold the held
    # rows into the graph (a copy)
    epochs = tf.data.Dataset.from_tensors(tf.constant(epoch, tf.int64))
    return epochs.flat_map(uniform_epochs(batches)).prefetch(tf.data.AUTOTUNE)
