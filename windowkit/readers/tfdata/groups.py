"""Groups of blocks for ``tf.data``: the sampler's order in the graph, the rows
read in the graph or through the format's row reader.

:func:`block_groups` yields *groups of blocks*: ``(rows, starts)``, the rows of
a group of storage blocks (each followed by the rows its windows reach past it)
and the positions in ``rows`` of the split's windows that start in them. The
epoch's groups come from the sampler, computed in the graph for the epoch the
reader's counter holds (block ids only, never data); a group's rows are read
ahead of the consumer, one group at a time
(:mod:`windowkit.readers.tfdata.reads`: TensorFlow's own ops for a
local, uncompressed TFRecord store; else one ``numpy_function`` call per group,
the format's row reader). :class:`BlockWindows` finds the split's window starts
per block, a lookup in the graph. :mod:`windowkit.readers.tf` then cuts the
windows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from windowkit.index import WindowRuns
from windowkit.location import is_remote
from windowkit.readers.epoch.choice import group_size
from windowkit.readers.epoch.permutation import tf_permute
from windowkit.readers.epoch.sampler import Sampler
from windowkit.readers.tfdata.reads import group_reads

if TYPE_CHECKING:
    import tensorflow as tf

    from windowkit.readers.plan import ReadPlan

REMOTE_GROUPS_AHEAD = 4  # groups read at once from object storage (latency, not bandwidth)


class BlockWindows:
    """The split's window starts in each block, as a graph-side lookup: block
    ``b`` holds runs ``row_splits[b]:row_splits[b + 1]`` (see
    :meth:`windowkit.index.WindowRuns.runs_per_block`), expanded in the graph
    with a sorted search (a few ops: ``tf.data`` instantiates its functions
    again for every epoch, at a cost that grows with their ops)."""

    def __init__(self, runs: WindowRuns, block_first: np.ndarray, block_rows: np.ndarray
                 ) -> None:
        import tensorflow as tf

        blocks = runs.runs_per_block(block_first, block_rows)
        self.windows = blocks.windows()
        self.stride = runs.stride
        self._splits = tf.constant(blocks.row_splits, tf.int64)
        self._first = tf.constant(blocks.first, tf.int64)
        self._count = tf.constant(blocks.count, tf.int64)
        self._series = tf.constant(blocks.series, tf.int32)

    @classmethod
    def of(cls, plan: ReadPlan) -> BlockWindows:
        """The plan's windows in each of the store's blocks."""
        block_first = np.arange(plan.layout.num_blocks, dtype=np.int64) * plan.layout.block_rows
        return cls(plan.runs, block_first,
                   np.minimum(plan.layout.block_rows, plan.layout.total_rows - block_first))

    def starts(self, blocks: tf.Tensor, offsets: tf.Tensor) -> tf.Tensor:
        """Row positions, in a tensor holding block ``blocks[i]`` at row
        ``offsets[i]``, of the windows starting in those blocks (block order)."""
        return self._starts(blocks, offsets)[0]

    def starts_and_series(self, blocks: tf.Tensor, offsets: tf.Tensor
                          ) -> tuple[tf.Tensor, tf.Tensor]:
        """:meth:`starts`, and the series (int32) of each of those windows."""
        import tensorflow as tf

        starts, run = self._starts(blocks, offsets)
        return starts, tf.gather(self._series, run)

    def _starts(self, blocks: tf.Tensor, offsets: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """The starts, and each one's run."""
        import tensorflow as tf

        low = tf.gather(self._splits, blocks)
        owner, k = expand(tf.gather(self._splits, blocks + 1) - low)  # the blocks' runs
        run = tf.gather(low, owner) + k
        at, j = expand(tf.gather(self._count, run))  # the runs' windows
        return (tf.gather(tf.gather(self._first, run), at) + j * self.stride
                + tf.gather(offsets, tf.gather(owner, at))), tf.gather(run, at)


def expand(counts: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """``counts[i]`` items for each ``i``, in order: each item's ``i`` and its
    number among that ``i``'s items (``0 .. counts[i] - 1``)."""
    import tensorflow as tf

    ends = tf.cumsum(counts)
    items = tf.range(tf.reduce_sum(counts), dtype=tf.int64)
    owner = tf.searchsorted(ends, items, side="right", out_type=tf.int64)
    return owner, items - tf.gather(ends - counts, owner)


def block_groups(plan: ReadPlan, *, shuffle: bool, seed: int,
                 shuffle_blocks: int | None, cache_bytes: int,
                 with_series: bool = False, graph_reads: bool = True,
                 epoch: tf.Tensor | int = 0, extra_windows: int = 0) -> tf.data.Dataset:
    """Epoch ``epoch``'s groups of blocks (see :class:`BlockGroups`)."""
    return BlockGroups(plan, shuffle=shuffle, seed=seed, shuffle_blocks=shuffle_blocks,
                       cache_bytes=cache_bytes, with_series=with_series,
                       graph_reads=graph_reads, extra_windows=extra_windows).epoch(epoch)


class BlockGroups:
    """Each epoch's groups of blocks for one plan, ``(rows, starts)``; with
    ``with_series``, ``(rows, starts, series)``, each window's series id too.

    The order is the one every reader follows (:class:`windowkit.readers.EpochOrder`):
    the whole split's blocks in the epoch's order, ``group`` at a time (sized
    from the whole split, so the same in every shard), the windows of a group
    (its blocks' windows in index order) permuted by the group's keyed
    permutation (:func:`windowkit.readers.epoch.permutation.tf_permute`, the NumPy readers'
    numbers), restricted to the plan's own windows (a shard's piece). A group
    reads only the plan's own blocks in it; groups without any are skipped.
    ``extra_windows`` (a shard's padding, +1, or trimming, -1) repeats or leaves
    out the epoch's last window. The rows are read in the graph where the store
    allows, else by one ``numpy_function`` call per group (always with
    ``graph_reads=False``): see
    :func:`windowkit.readers.tfdata.reads.group_reads`. Everything that
    opens the store happens here, once, not while an epoch's dataset is traced."""

    def __init__(self, plan: ReadPlan, *, shuffle: bool, seed: int,
                 shuffle_blocks: int | None, cache_bytes: int, with_series: bool = False,
                 graph_reads: bool = True, extra_windows: int = 0) -> None:
        import tensorflow as tf

        layout = plan.layout
        self.plan, self.shuffle = plan, shuffle
        self.with_series, self.extra_windows = with_series, extra_windows
        split_counts = plan.split_windows_per_block()
        group = group_size(plan, shuffle_blocks, cache_bytes=cache_bytes)
        self.sampler = Sampler(split_counts, group=group, shuffle=shuffle, seed=seed)
        owned = plan.windows_per_block() > 0  # blocks where the plan's own windows start
        self.reads = group_reads(plan, np.flatnonzero(owned), graph_reads=graph_reads)
        self.share = plan.shard_share
        self.block_rows = layout.block_rows
        runs = plan.whole_split
        self._owned = tf.constant(owned)
        self._counts = tf.constant(split_counts, tf.int64)
        self._first = tf.constant(np.concatenate([[0], np.cumsum(split_counts)[:-1]]), tf.int64)
        self._run_first = tf.constant(runs.cumulative[:-1], tf.int64)
        self._run_start = tf.constant(runs.global_first, tf.int64)
        self._run_series = tf.constant(runs.series, tf.int32)
        self._stride = runs.stride

    def _windows(self, blocks: tf.Tensor, key: tf.Tensor) -> tf.Tensor:
        """Index positions of the plan's own windows of the group of ``blocks``
        (ascending), in the group's order."""
        import tensorflow as tf

        owner, k = expand(tf.gather(self._counts, blocks))
        positions = tf.gather(tf.gather(self._first, blocks), owner) + k
        if self.shuffle:
            size = tf.size(positions, out_type=tf.int64)
            order = tf_permute(tf.range(size), size, tf.bitcast(key, tf.uint64))
            positions = tf.gather(positions, order)
        if self.share.whole:
            return positions
        return tf.boolean_mask(positions, (positions >= self.share.lo)
                               & (positions < self.share.hi))

    def _fit(self, last: tf.Tensor, values: tf.Tensor) -> tf.Tensor:
        """The last group's windows with the epoch's last one repeated or left out."""
        import tensorflow as tf

        if self.extra_windows == 0:
            return values
        changed = (tf.concat([values, values[-1:]], 0) if self.extra_windows > 0
                   else values[:-1])
        return tf.cond(last, lambda: changed, lambda: values)

    def _load(self, blocks: tf.Tensor, key: tf.Tensor, last: tf.Tensor
              ) -> tuple[tf.Tensor, ...]:
        import tensorflow as tf

        positions = self._fit(last, self._windows(blocks, key))
        run = tf.searchsorted(self._run_first, positions, side="right", out_type=tf.int64) - 1
        starts = (tf.gather(self._run_start, run)
                  + (positions - tf.gather(self._run_first, run)) * self._stride)
        own = tf.boolean_mask(blocks, tf.gather(self._owned, blocks))
        rows, offsets = self.reads.rows(own)
        block = starts // self.block_rows
        at = tf.searchsorted(own, block, side="left", out_type=tf.int64)
        local = tf.gather(offsets, at) + starts - block * self.block_rows
        if not self.with_series:
            return rows, local
        return rows, local, tf.gather(self._run_series, run)

    def epoch(self, epoch: tf.Tensor | int) -> tf.data.Dataset:
        """Epoch ``epoch``'s groups, read one group at a time (bounded memory),
        ahead of the cuts of the previous one; from object storage several, so
        that request latency overlaps."""
        import tensorflow as tf

        sampler = self.sampler
        blocks, keys = sampler.tf_epoch(sampler.tf_epoch_key(
            tf.convert_to_tensor(epoch, tf.int64)))
        size = sampler.group
        group_of = tf.range(tf.size(blocks, out_type=tf.int64)) // size
        owned = tf.gather(self._owned, blocks)
        last_group = tf.reduce_max(tf.where(owned, group_of, -1))
        has_own = tf.math.unsorted_segment_max(tf.cast(owned, tf.int32), group_of,
                                               sampler.num_groups) > 0

        def group(g: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
            return blocks[g * size:(g + 1) * size], keys[g * size], tf.equal(g, last_group)

        groups = tf.data.Dataset.range(sampler.num_groups).filter(
            lambda g: tf.gather(has_own, g)).map(group)
        ahead = REMOTE_GROUPS_AHEAD if is_remote(self.plan.store.path) else 1
        return groups.map(tf.autograph.experimental.do_not_convert(self._load),
                          num_parallel_calls=ahead, deterministic=True)
