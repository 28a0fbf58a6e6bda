"""Groups of blocks for ``tf.data``: the sampler's order in the graph, the rows
read in the graph or through the format's row reader.

:func:`block_groups` yields *groups of blocks*: ``(rows, starts)``, the rows of
a group of storage blocks (each followed by the rows its windows reach past it)
and the positions in ``rows`` of the split's windows that start in them. The
epoch's groups come from the sampler, computed in the graph for the epoch the
reader's counter holds (block ids only, never data); a group's rows are read
ahead of the consumer, one group at a time
(:mod:`windowkit.readers.tfdata_engine.reads`: TensorFlow's own ops for a
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
from windowkit.readers.tfdata_engine.reads import group_reads
from windowkit.sampler import Sampler, blocks_per_group

if TYPE_CHECKING:
    import tensorflow as tf

    from windowkit.readers.plan import ReadPlan

GROUP_SHARE = 6  # a group's rows are held ~6 times (read-ahead, decode, cut, batches)
REMOTE_GROUPS_AHEAD = 4  # groups read at once from object storage (latency, not bandwidth)


def default_group(shuffle_blocks: int | None, *, cache_bytes: int, block_bytes: int,
                  num_blocks: int) -> int:
    """Blocks whose windows are mixed together: ``shuffle_blocks``, else every
    block holding windows when ``GROUP_SHARE`` copies of them fit ``cache_bytes``,
    else what does."""
    if shuffle_blocks is None:
        return blocks_per_group(num_blocks, fits=cache_bytes // max(1, block_bytes),
                                copies=GROUP_SHARE)
    return max(1, min(shuffle_blocks, max(1, num_blocks)))


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


def epoch_groups(sampler: Sampler, epoch: tf.Tensor) -> tf.data.Dataset:
    """The sampler's groups of epoch ``epoch``, ``(index, blocks, group_key)``,
    computed in the graph."""
    by_group = sampler.tf_epoch_blocks(epoch).batch(sampler.group)
    return by_group.map(lambda blocks, keys: (blocks, keys[0])).enumerate()


def block_groups(plan: ReadPlan, *, shuffle: bool, seed: int,
                 shuffle_blocks: int | None, cache_bytes: int,
                 with_series: bool = False, graph_reads: bool = True,
                 epoch: tf.Tensor | int = 0, extra_windows: int = 0) -> tf.data.Dataset:
    """Epoch ``epoch``'s groups of blocks (see :class:`BlockGroups`)."""
    return BlockGroups(plan, shuffle=shuffle, seed=seed, shuffle_blocks=shuffle_blocks,
                       cache_bytes=cache_bytes, with_series=with_series,
                       graph_reads=graph_reads, extra_windows=extra_windows).epoch(epoch)


class BlockGroups:
    """Each epoch's groups of blocks, ``(rows, starts)``, the starts shuffled
    when asked; with ``with_series``, ``(rows, starts, series)``, each window's
    series id too. ``extra_windows`` (a shard's padding, +1, or trimming, -1)
    repeats or leaves out the epoch's last window. The rows are read in the
    graph where the store allows, else by one ``numpy_function`` call per
    group (always with ``graph_reads=False``): see
    :func:`windowkit.readers.tfdata_engine.reads.group_reads`. Everything that
    opens the store happens here, once, not while an epoch's dataset is traced."""

    def __init__(self, plan: ReadPlan, *, shuffle: bool, seed: int,
                 shuffle_blocks: int | None, cache_bytes: int, with_series: bool = False,
                 graph_reads: bool = True, extra_windows: int = 0) -> None:
        spec, layout = plan.spec, plan.layout
        self.plan, self.shuffle, self.seed = plan, shuffle, seed
        self.with_series, self.extra_windows = with_series, extra_windows
        self.windows = BlockWindows.of(plan)
        useful = np.flatnonzero(self.windows.windows > 0)  # only blocks where windows start
        group = default_group(shuffle_blocks, cache_bytes=cache_bytes,
                              block_bytes=(layout.block_rows + spec.span - 1) * layout.row_bytes,
                              num_blocks=len(useful))
        self.sampler = Sampler(self.windows.windows, group=group, shuffle=shuffle, seed=seed)
        self.reads = group_reads(plan, self.sampler.blocks, graph_reads=graph_reads)

    def _fit(self, index: tf.Tensor, values: tf.Tensor) -> tf.Tensor:
        """The last group's windows with the epoch's last one repeated or left out."""
        import tensorflow as tf

        if self.extra_windows == 0:
            return values
        changed = (tf.concat([values, values[-1:]], 0) if self.extra_windows > 0
                   else values[:-1])
        last = self.sampler.num_groups - 1
        return tf.cond(tf.equal(index, last), lambda: changed, lambda: values)

    def _load(self, index: tf.Tensor, group_blocks: tuple[tf.Tensor, tf.Tensor]
              ) -> tuple[tf.Tensor, ...]:
        import tensorflow as tf

        blocks, key = group_blocks
        windows, fit = self.windows, self._fit
        rows, offsets = self.reads.rows(blocks)
        shuffle_seed = tf.stack([tf.constant(self.seed, tf.int64), key])
        if not self.with_series:
            starts = windows.starts(blocks, offsets)
            if self.shuffle:
                starts = tf.random.experimental.stateless_shuffle(starts, seed=shuffle_seed)
            return rows, fit(index, starts)
        starts, series = windows.starts_and_series(blocks, offsets)
        if self.shuffle:  # one permutation for both
            order = tf.random.experimental.stateless_shuffle(
                tf.range(tf.size(starts, out_type=tf.int64)), seed=shuffle_seed)
            starts, series = tf.gather(starts, order), tf.gather(series, order)
        return rows, fit(index, starts), fit(index, series)

    def epoch(self, epoch: tf.Tensor | int) -> tf.data.Dataset:
        """Epoch ``epoch``'s groups, read one group at a time (bounded memory),
        ahead of the cuts of the previous one; from object storage several, so
        that request latency overlaps."""
        import tensorflow as tf

        ds = epoch_groups(self.sampler, tf.convert_to_tensor(epoch, tf.int64))
        ahead = REMOTE_GROUPS_AHEAD if is_remote(self.plan.store.path) else 1
        return ds.map(tf.autograph.experimental.do_not_convert(self._load),
                      num_parallel_calls=ahead, deterministic=True)
