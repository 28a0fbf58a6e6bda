"""Uniform shuffling for ``tf.data``: each epoch a uniform permutation of the
split's windows, batches gathered by random access.

The rows are held once (:class:`windowkit.readers.numpy_engine.held.HeldRows`: in memory
within ``memory_budget``, else spilled to a private file on local disk); each
chunk of batches is one ``numpy_function`` call
(:class:`windowkit.readers.numpy_engine.batches.EpochBatches`: a keyed
permutation, one fancy index, the batch's fields), run in parallel by
``map``: the gathers release the interpreter lock. Each iteration of the
dataset reads the next epoch (:mod:`windowkit.readers.tfdata_engine.epochs`),
whose permutation is the one every reader uses for that epoch; an iterator's
position is a batch number, so ``tf.train.Checkpoint`` saves it symbolically.

A store replaced while it is read (``convert --overwrite``) is
:class:`windowkit.errors.StoreReplacedError` at the next epoch at the latest,
never the held (or spilled) rows of the old one served on: the first chunk of
every epoch checks the store, whatever epoch number it reads (a distributed
dataset, or Keras ``fit`` without the epoch callback, reads the same one again;
a new epoch number is checked by :class:`EpochBatches` too).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from windowkit.readers.tfdata_engine.cut import PREFETCH_BATCHES

if TYPE_CHECKING:
    import tensorflow as tf

    from windowkit.readers.numpy_engine.batches import EpochBatches

CHUNK_BATCHES = 8  # batches gathered by one numpy_function call

MakeEpoch = Callable[["tf.Tensor"], "tf.data.Dataset"]  # an epoch -> its batches


def uniform_epochs(batches: EpochBatches) -> MakeEpoch:
    """A function from an epoch to its batches, as a ``tf.data.Dataset``: one
    ``numpy_function`` call per chunk of ``CHUNK_BATCHES`` batches (a call
    costs more than cutting a batch's windows), chunks in parallel, each sliced
    into its batches in the graph. ``batches`` holds the rows."""
    import tensorflow as tf

    batches.hold()
    batch_size = batches.batch_size
    chunk = CHUNK_BATCHES * batch_size
    probe = batches.windows_at(0, np.zeros(1, dtype=np.int64))  # structure and dtypes
    flat_probe = tf.nest.flatten(probe)
    dtypes = [tf.as_dtype(np.asarray(part).dtype) for part in flat_probe]
    shapes = [tf.TensorShape([None, *np.shape(part)[1:]]) for part in flat_probe]
    total = batches.windows_per_epoch
    full = batches.batch.drop_remainder or total % batch_size == 0  # every batch whole
    batch_shapes = [tf.TensorShape([batch_size if full else None, *shape[1:]])
                    for shape in shapes]

    # windows read an epoch
    windows = (batches.batches_per_epoch * batch_size if batches.batch.drop_remainder
               else total)

    guard = batches.plan.store.guard

    def cut_chunk(epoch: Any, lo: Any) -> list[np.ndarray]:  # the chunk's windows, cut
        if int(lo) == 0:  # an epoch's first chunk: a replaced store is an error
            guard.check()
        hi = min(int(lo) + chunk, windows)
        part = batches.windows_at(int(epoch), np.arange(int(lo), hi, dtype=np.int64))
        return [np.asarray(array) for array in tf.nest.flatten(part)]

    def batch_at(flat: tuple[tf.Tensor, ...], lo: tf.Tensor) -> Any:
        parts = [tensor[lo:lo + batch_size] for tensor in flat]
        for tensor, shape in zip(parts, batch_shapes, strict=True):
            tensor.set_shape(shape)
        return tf.nest.pack_sequence_as(probe, parts)

    def load(lo: tf.Tensor, epoch: tf.Tensor) -> tuple[tf.Tensor, tuple[tf.Tensor, ...]]:
        # stateless: a chunk depends only on (epoch, lo), so symbolic
        # checkpointing records the position and nothing else
        flat = tf.numpy_function(cut_chunk, [epoch, lo], dtypes, stateful=False)
        for tensor, shape in zip(flat, shapes, strict=True):
            tensor.set_shape(shape)
        return tf.minimum(tf.constant(chunk, tf.int64), windows - lo), tuple(flat)

    def chunk_batches(size: tf.Tensor, flat: tuple[tf.Tensor, ...]) -> tf.data.Dataset:
        return tf.data.Dataset.range(0, size, batch_size).map(lambda at: batch_at(flat, at))

    def one_epoch(epoch: tf.Tensor) -> tf.data.Dataset:
        chunks = tf.data.Dataset.range(0, windows, chunk)
        return chunks.map(lambda lo: load(lo, epoch),
                          num_parallel_calls=tf.data.AUTOTUNE,
                          deterministic=True).flat_map(chunk_batches)

    return one_epoch


def uniform_dataset(batches: EpochBatches, epoch: int = 0) -> tf.data.Dataset:
    """Epoch ``epoch`` of ``batches``, as one dataset (benchmarks)."""
    import tensorflow as tf

    return uniform_epochs(batches)(tf.constant(epoch, tf.int64)).prefetch(PREFETCH_BATCHES)
