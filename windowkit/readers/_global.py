"""``shuffle="global"``: each epoch a uniform random permutation of the split's
windows, batches cut from rows held in memory.

The rows the split's windows need (the storage blocks where they start, each
with its halo) are read once, with the format's row reader, and held as one
tensor: at most ``memory_budget`` bytes, else one line says how much is needed.
The window starts are computed once (8 bytes per window). Each epoch draws a
key from the seed; batch ``b`` holds the windows at epoch positions
``b*B .. b*B+B-1`` of a keyed bijection of ``[0, n)``
(``tf.random.experimental.index_shuffle``): no permutation is ever
materialized, and an iterator's position is all its state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from windowkit._progress import human_size
from windowkit.errors import InvalidSpecError
from windowkit.readers._cut import PREFETCH_BATCHES, WindowCutter
from windowkit.readers._order import num_batches
from windowkit.readers._parts import BatchParts

if TYPE_CHECKING:
    import tensorflow as tf

    from windowkit.readers.plan import ReadPlan


def check_memory_budget(plan: ReadPlan, memory_budget: int) -> int:
    """The bytes of rows global shuffling holds for ``plan``; one line if more
    than ``memory_budget``."""
    needed = plan.rows_bytes()
    if needed > memory_budget:
        raise InvalidSpecError(
            f"{plan.path}: shuffle='global' holds the rows of split {plan.split!r} in "
            f"memory, {human_size(needed)}, more than memory_budget={memory_budget} "
            f"({human_size(memory_budget)}); raise memory_budget, shard the reading "
            "(num_shards=), or use shuffle=True (block groups, bounded memory)")
    return needed


def load_rows(plan: ReadPlan) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(rows, blocks, offsets)``: the rows of every block holding the plan's
    windows (ascending), block ``blocks[i]`` starting at ``rows[offsets[i]]``
    and followed by its halo."""
    from windowkit.readers._groups import GroupLoader

    blocks = np.flatnonzero(plan.windows_per_block()).astype(np.int64)
    rows, offsets = GroupLoader.of(plan)(blocks)
    return rows, blocks, offsets


def global_batches(plan: ReadPlan, *, batch_size: int, seed: int, drop_remainder: bool,
                   normalize: bool, memory_budget: int, parts: BatchParts
                   ) -> tf.data.Dataset:
    """Batches of uniformly shuffled windows, a new permutation each iteration
    (epoch), the sequence of epochs fixed by ``seed``."""
    import tensorflow as tf

    from windowkit.readers._groups import BlockWindows

    check_memory_budget(plan, memory_budget)
    rows, blocks, offsets = load_rows(plan)
    lookup = BlockWindows.of(plan)
    starts, series = lookup.starts_and_series(tf.constant(blocks), tf.constant(offsets))
    series = series if parts.series else None  # [n] int32 beside the [n] int64 starts
    held = tf.constant(rows)
    del rows
    n = plan.num_windows
    batches = num_batches(n, batch_size, drop_remainder)
    cut = WindowCutter(plan.spec, plan.normalizer() if normalize else None,
                       plan.target_index, parts)
    prepared = cut.prepare(held, narrow=False)  # no column copies: within memory_budget
    seed_part = tf.constant(seed, tf.int64)

    def batch(index: tf.Tensor, key: tf.Tensor) -> tf.Tensor:
        lo = index * batch_size
        positions = tf.range(lo, tf.minimum(lo + batch_size, n))
        shuffled = tf.random.experimental.index_shuffle(
            positions, seed=tf.stack([seed_part, key]), max_index=n - 1)
        return cut(prepared, tf.gather(starts, shuffled),
                   None if series is None else tf.gather(series, shuffled))

    def epoch(key: tf.Tensor) -> tf.data.Dataset:
        return tf.data.Dataset.range(batches).map(
            lambda index: batch(index, key), num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True)

    keys = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).take(1)
    ds = keys.flat_map(epoch)
    ds = ds.apply(tf.data.experimental.assert_cardinality(batches))
    return ds.prefetch(PREFETCH_BATCHES)
