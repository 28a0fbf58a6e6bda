"""Uniform shuffling for ``tf.data``: each epoch a uniform permutation of the
split's windows, batches gathered by random access.

The rows are held once (:class:`windowkit.readers._random.HeldRows`: in memory
within ``memory_budget``, else spilled to a private file on local disk); each
batch is one ``numpy_function`` call (:class:`UniformBatches`: a keyed
permutation, one fancy index, the batch's parts), run in parallel by
``map``: the gathers release the interpreter lock. Each iteration of the
dataset draws a new key from the seed; an iterator's position is a batch
number, so ``tf.train.Checkpoint`` saves it symbolically.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from windowkit.errors import InvalidSpecError
from windowkit.readers._cut import PREFETCH_BATCHES
from windowkit.readers._order import num_batches
from windowkit.readers._parts import BatchParts
from windowkit.readers._random import HeldRows, UniformBatches, default_memory_budget

if TYPE_CHECKING:
    import tensorflow as tf

    from windowkit.readers.plan import ReadPlan

SHUFFLES = (True, False, "global", "blocks")
CHUNK_BATCHES = 8  # batches gathered by one numpy_function call


@dataclass(frozen=True)
class ShuffleChoice:
    """How a reader shuffles, and the bytes it may hold.

    ``mode``: ``"uniform"`` (a uniform permutation each epoch, rows held once,
    in memory or spilled), ``"whole"`` (uniform too: one group of every
    block), ``"blocks"`` (block groups, as large as the budget holds) or
    ``"ordered"`` (index order)."""

    mode: str
    memory_budget: int
    cache_bytes: int

    @property
    def uniform(self) -> bool:
        """Uniform with the rows held once (:class:`UniformBatches`)."""
        return self.mode == "uniform"

    @property
    def grouped(self) -> bool:
        """Read as groups of blocks (one group of every block when ``"whole"``)."""
        return self.mode in ("whole", "blocks")


def choose_shuffle(plan: ReadPlan, shuffle: bool | str, *, memory_budget: int | None = None,
                   cache_bytes: int | None = None, shuffle_blocks: int | None = None,
                   sharded: bool | None = None) -> ShuffleChoice:
    """``True``: uniform when the split's rows fit ``memory_budget`` (default:
    :func:`default_memory_budget`), else block groups sized by it;
    ``"global"``: uniform at any size (beyond the budget, spilled to local
    disk); ``"blocks"``: block groups; ``False``: index order. ``cache_bytes``
    or ``shuffle_blocks`` (experts) size block groups apart from the budget,
    and so ask ``True`` for block groups.

    A uniform split whose rows fit the budget ``GROUP_SHARE`` times over
    (read-ahead, decoding, cutting) is read as one group of every block
    (``"whole"``): each epoch the same uniform permutation of its windows, cut
    in the graph, the fastest way; sharded (``sharded``, default: whether
    ``plan`` is a shard), a uniform shuffle deals out one permutation."""
    from windowkit.readers._groups import GROUP_SHARE

    budget = default_memory_budget() if memory_budget is None else memory_budget
    groups = budget if cache_bytes is None else cache_bytes
    sharded = plan.shard != (0, 1) if sharded is None else sharded
    rows = plan.rows_bytes()
    whole = not sharded and rows * GROUP_SHARE <= budget
    if shuffle is False:
        mode = "ordered"
    elif shuffle == "global":
        mode = "whole" if whole else "uniform"
    elif shuffle == "blocks":
        mode = "blocks"
    elif shuffle is True:
        if cache_bytes is not None or shuffle_blocks is not None:
            mode = "blocks"
        else:
            mode = "whole" if whole else "uniform" if rows <= budget else "blocks"
    else:
        raise InvalidSpecError(f"shuffle must be one of {SHUFFLES}, got {shuffle!r}")
    return ShuffleChoice(mode, budget, groups)


def uniform_source(plan: ReadPlan, *, batch_size: int, seed: int, normalize: bool,
                   memory_budget: int, parts: BatchParts,
                   spill_dir: str | os.PathLike[str] | None = None) -> UniformBatches:
    """The split's rows held (in memory or spilled) and its uniform batches."""
    held = HeldRows(plan, memory_budget=memory_budget, spill_dir=spill_dir)
    shard = plan.shard if plan.dealt else (0, 1)
    return UniformBatches(plan, held, batch_size=batch_size, seed=seed, normalize=normalize,
                          parts=parts, shard=shard)


def global_batches(plan: ReadPlan, *, batch_size: int, seed: int, drop_remainder: bool,
                   normalize: bool, memory_budget: int, parts: BatchParts,
                   spill_dir: str | os.PathLike[str] | None = None) -> tf.data.Dataset:
    """Batches of uniformly shuffled windows, a new permutation each iteration
    (epoch), the sequence of epochs fixed by ``seed``."""
    source = uniform_source(plan, batch_size=batch_size, seed=seed, normalize=normalize,
                            memory_budget=memory_budget, parts=parts, spill_dir=spill_dir)
    return uniform_dataset(source, seed=seed, drop_remainder=drop_remainder)


def uniform_dataset(source: UniformBatches, *, seed: int, drop_remainder: bool
                    ) -> tf.data.Dataset:
    """``source``'s batches as a ``tf.data.Dataset``: one ``numpy_function``
    call per chunk of ``CHUNK_BATCHES`` batches (a call costs more than
    cutting a batch's windows), chunks in parallel, each sliced into its
    batches in the graph; each iteration a new key drawn from ``seed``."""
    import tensorflow as tf

    batch_size, total = source.batch_size, source.num_windows
    batches = num_batches(total, batch_size, drop_remainder)
    windows = batches * batch_size if drop_remainder else total  # read per epoch
    chunk = CHUNK_BATCHES * batch_size
    probe = source.windows(0, 0, 1)  # the batches' structure and dtypes
    flat_probe = tf.nest.flatten(probe)
    dtypes = [tf.as_dtype(np.asarray(part).dtype) for part in flat_probe]
    shapes = [tf.TensorShape([None, *np.shape(part)[1:]]) for part in flat_probe]
    full = drop_remainder or total % batch_size == 0  # every batch whole
    batch_shapes = [tf.TensorShape([batch_size if full else None, *shape[1:]])
                    for shape in shapes]

    def cut_chunk(key: Any, lo: Any) -> list[np.ndarray]:  # the chunk's windows, cut
        part = source.windows(int(key) % 2**64, int(lo), min(int(lo) + chunk, windows))
        return [np.asarray(array) for array in tf.nest.flatten(part)]

    def batch_at(flat: tuple[tf.Tensor, ...], lo: tf.Tensor) -> Any:
        parts = [tensor[lo:lo + batch_size] for tensor in flat]
        for tensor, shape in zip(parts, batch_shapes, strict=True):
            tensor.set_shape(shape)
        return tf.nest.pack_sequence_as(probe, parts)

    def load(lo: tf.Tensor, key: tf.Tensor) -> tuple[tf.Tensor, tuple[tf.Tensor, ...]]:
        # stateless: a chunk depends only on (key, lo), so symbolic
        # checkpointing records the position and nothing else
        flat = tf.numpy_function(cut_chunk, [key, lo], dtypes, stateful=False)
        for tensor, shape in zip(flat, shapes, strict=True):
            tensor.set_shape(shape)
        return tf.minimum(tf.constant(chunk, tf.int64), windows - lo), tuple(flat)

    def chunk_batches(size: tf.Tensor, flat: tuple[tf.Tensor, ...]) -> tf.data.Dataset:
        return tf.data.Dataset.range(0, size, batch_size).map(lambda at: batch_at(flat, at))

    def epoch(key: tf.Tensor) -> tf.data.Dataset:
        chunks = tf.data.Dataset.range(0, windows, chunk)
        return chunks.map(lambda lo: load(lo, key), num_parallel_calls=tf.data.AUTOTUNE,
                          deterministic=True).flat_map(chunk_batches)

    keys = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).take(1)
    ds = keys.flat_map(epoch)
    ds = ds.apply(tf.data.experimental.assert_cardinality(batches))
    return ds.prefetch(PREFETCH_BATCHES)
