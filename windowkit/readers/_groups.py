"""Groups of blocks for ``tf.data``: the sampler's order in the graph, the rows
read through the format's row reader.

:func:`block_groups` yields *groups of blocks*: ``(rows, starts)``, the rows of
a group of storage blocks (each followed by its halo of ``span - 1`` rows) and
the positions in ``rows`` of the split's windows that start in them. The
epoch's groups come from the sampler, computed in the graph (block ids only,
never data); one ``numpy_function`` call per group reads its blocks with the
format's row reader (neighbouring blocks as one range, checksums checked), one
Python call per group of megabytes, ahead of the consumer.
:class:`BlockWindows` finds the split's window starts per block, a ragged
lookup in the graph. :mod:`windowkit.readers.tf` then cuts the windows.
"""

from __future__ import annotations

import copy
import queue
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np

from windowkit.errors import StoreError
from windowkit.formats.base import RowReader
from windowkit.index import WindowRuns
from windowkit.location import is_remote
from windowkit.sampler import Sampler, blocks_per_group

if TYPE_CHECKING:
    import tensorflow as tf

    from windowkit.readers.plan import ReadPlan

GROUP_SHARE = 6  # a group's rows are held ~6 times (read-ahead, decode, cut, batches)
REMOTE_GROUPS_AHEAD = 4  # groups read at once from object storage (latency, not bandwidth)
REMOTE_READERS = 8  # ranges read at once from object storage
HEAD_CACHE_BYTES = 32 << 20  # the first rows of blocks read: later halos need no read


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
    """The split's window starts in each block, as a graph-side ragged lookup."""

    def __init__(self, runs: WindowRuns, block_first: np.ndarray, block_rows: np.ndarray
                 ) -> None:
        import tensorflow as tf

        row_splits, first, count = runs.runs_per_block(block_first, block_rows)
        self.windows = np.bincount(np.repeat(np.arange(len(block_first)), np.diff(row_splits)),
                                   weights=count, minlength=len(block_first)).astype(np.int64)
        self.stride = runs.stride
        self._first = tf.RaggedTensor.from_row_splits(first, row_splits, validate=False)
        self._count = tf.RaggedTensor.from_row_splits(count, row_splits, validate=False)
        self._series = tf.RaggedTensor.from_row_splits(
            runs.series_per_block(block_first, block_rows), row_splits, validate=False)

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
        return starts, tf.gather(tf.gather(self._series, blocks).flat_values, run)

    def _starts(self, blocks: tf.Tensor, offsets: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """The starts, and the position among the blocks' runs of each one's run."""
        import tensorflow as tf

        firsts = tf.gather(self._first, blocks)
        counts = tf.gather(self._count, blocks)
        within = tf.ragged.range(counts.flat_values)
        run = within.value_rowids()
        owner = tf.gather(firsts.value_rowids(), run)
        return (tf.gather(firsts.flat_values, run) + within.flat_values * self.stride
                + tf.gather(offsets, owner)), run


class GroupLoader:
    """Reads a group of blocks, each with its halo, into one array of rows.

    A reader keeps open files, so it reads one range at a time; with
    ``readers > 1`` (object storage: latency, not bandwidth, bounds a read)
    that many copies of it (``copy.copy``: a format may share what its
    readers learnt of the files) read a group's ranges, and concurrent groups,
    at once.

    A block's halo is the first ``halo`` rows of the next block, and reading
    them costs a whole chunk or row group. So the loader keeps the heads of the
    blocks it read (``HEAD_CACHE_BYTES``): a halo whose block was read before
    in the epoch is not read again."""

    def __init__(self, reader: RowReader, *, total_rows: int, halo: int,
                 readers: int = 1) -> None:
        self.block_rows = reader.block_rows
        self.total_rows = total_rows
        self.halo = halo
        self._idle: queue.SimpleQueue[RowReader] = queue.SimpleQueue()
        for twin in [reader] + [copy.copy(reader) for _ in range(readers - 1)]:
            self._idle.put(twin)
        self._pool = ThreadPoolExecutor(readers, "windowkit-group") if readers > 1 else None
        self._fetches_together = reader.fetches_together
        self._heads: OrderedDict[int, np.ndarray] = OrderedDict()  # block -> its first rows
        self._head_bytes = 0
        self._heads_lock = threading.Lock()

    @classmethod
    def of(cls, plan: ReadPlan) -> GroupLoader:
        """A loader of the plan's store: one reader locally, ``REMOTE_READERS``
        copies on object storage."""
        return cls(plan.store.row_reader(), total_rows=plan.layout.total_rows,
                   halo=plan.spec.span - 1,
                   readers=REMOTE_READERS if is_remote(plan.store.path) else 1)

    def _head(self, block: int) -> np.ndarray | None:
        with self._heads_lock:
            return self._heads.get(block)

    def _keep_heads(self, rows: np.ndarray, first_row: int, blocks: range) -> None:
        """Remember the first ``halo`` rows of each of ``blocks`` found in ``rows``
        (which start at global row ``first_row``)."""
        if self.halo == 0:
            return
        with self._heads_lock:
            for block in blocks:
                lo = block * self.block_rows - first_row
                want = min(self.halo, self.total_rows - block * self.block_rows)
                if block in self._heads or lo < 0 or lo + want > len(rows):
                    continue
                head = rows[lo:lo + want].copy()
                self._heads[block] = head
                self._head_bytes += head.nbytes
            while self._head_bytes > HEAD_CACHE_BYTES and self._heads:
                self._head_bytes -= self._heads.popitem(last=False)[1].nbytes

    def _read(self, ranges: list[tuple[int, int]]) -> list[np.ndarray]:
        reader = self._idle.get()  # waits for a free reader
        try:
            return reader.read_many(ranges)
        finally:
            self._idle.put(reader)

    def _read_all(self, ranges: list[tuple[int, int]]) -> list[np.ndarray]:
        """Every range: with one call when the reader fetches ranges together
        (``read_many``), else spread over the reader copies."""
        if self._pool is None or len(ranges) == 1 or self._fetches_together:
            return self._read(ranges)
        return [part for parts in self._pool.map(self._read, [[r] for r in ranges])
                for part in parts]

    def __call__(self, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(rows, offsets)``: block ``blocks[i]`` (ascending) starts at
        ``rows[offsets[i]]`` and is followed by its halo. Runs of neighbouring
        blocks are read with one call and share their rows."""
        size = self.block_rows
        breaks = np.flatnonzero(np.diff(blocks) != 1) + 1
        heads = np.concatenate([[0], breaks])
        ends = np.concatenate([breaks, [len(blocks)]])
        lo = blocks[heads] * size
        hi = np.minimum(self.total_rows, (blocks[ends - 1] + 1) * size + self.halo)
        run_offset = np.concatenate([[0], np.cumsum(hi - lo)])
        offsets = (np.repeat(run_offset[:-1] - lo, ends - heads) + blocks * size).astype(np.int64)
        # a run's halo is the next block's head: read it only when not already known
        known = [self._head(int(blocks[e - 1]) + 1) if hi[k] > (blocks[e - 1] + 1) * size
                 else None for k, e in enumerate(ends)]
        stops = [int(min(h, (blocks[e - 1] + 1) * size)) if head is not None else int(h)
                 for h, e, head in zip(hi, ends, known, strict=True)]
        parts = self._read_all([(int(a), b) for a, b in zip(lo, stops, strict=True)])
        for k, part in enumerate(parts):
            first, last = int(blocks[heads[k]]), int(blocks[ends[k] - 1])
            self._keep_heads(part, int(lo[k]), range(first, last + 2))
            head = known[k]
            if head is not None and len(part) == stops[k] - lo[k]:
                parts[k] = np.concatenate([part, head])
        for k, part in enumerate(parts):  # a short read would shift every later block
            if len(part) != hi[k] - lo[k]:
                first, last = int(blocks[heads[k]]), int(blocks[ends[k] - 1])
                which = f"block {first}" if first == last else f"blocks {first}..{last}"
                raise StoreError(f"{which} (rows {lo[k]}..{hi[k]}): the store returned "
                                 f"{len(part)} rows, expected {hi[k] - lo[k]}")
        rows = parts[0] if len(parts) == 1 else np.concatenate(parts)
        return rows, offsets


def epoch_groups(sampler: Sampler) -> tf.data.Dataset:
    """The sampler's groups of one epoch, ``(blocks, group_key)``, computed in the
    graph: each iteration of the dataset is a new epoch (keyed from the seed)."""
    by_group = sampler.tf_epoch_blocks().batch(sampler.group)
    return by_group.map(lambda blocks, keys: (blocks, keys[0]))


def block_groups(plan: ReadPlan, *, shuffle: bool, seed: int,
                 shuffle_blocks: int | None, cache_bytes: int,
                 with_series: bool = False) -> tf.data.Dataset:
    """Groups of blocks read through the format's row reader, one ``numpy_function``
    call per group: ``(rows, starts)``, the starts shuffled when asked; with
    ``with_series``, ``(rows, starts, series)``, each window's series id too."""
    import tensorflow as tf

    spec, layout = plan.spec, plan.layout
    step_shape = layout.step_shape
    windows = BlockWindows.of(plan)
    useful = np.flatnonzero(windows.windows > 0)  # only blocks where split windows start
    group = default_group(shuffle_blocks, cache_bytes=cache_bytes,
                          block_bytes=(layout.block_rows + spec.span - 1) * layout.row_bytes,
                          num_blocks=len(useful))
    sampler = Sampler(windows.windows, group=group, shuffle=shuffle, seed=seed)
    remote = is_remote(plan.store.path)
    loader = GroupLoader.of(plan)
    dtype = tf.as_dtype(layout.dtype)

    def load(blocks: tf.Tensor, key: tf.Tensor) -> tuple[tf.Tensor, ...]:
        # stateless: the rows depend only on the block ids (the loader's caches
        # never change them); a stateful op makes symbolic checkpointing log a
        # FAILED_PRECONDITION warning at every group
        rows, offsets = tf.numpy_function(loader, [blocks], [dtype, tf.int64],
                                          stateful=False)
        rows = tf.ensure_shape(rows, [None, *step_shape])
        offsets = tf.ensure_shape(offsets, [None])
        shuffle_seed = tf.stack([tf.constant(seed, tf.int64), key])
        if not with_series:
            starts = windows.starts(blocks, offsets)
            if shuffle:
                starts = tf.random.experimental.stateless_shuffle(starts, seed=shuffle_seed)
            return rows, starts
        starts, series = windows.starts_and_series(blocks, offsets)
        if shuffle:  # one permutation for both
            order = tf.random.experimental.stateless_shuffle(
                tf.range(tf.size(starts, out_type=tf.int64)), seed=shuffle_seed)
            starts, series = tf.gather(starts, order), tf.gather(series, order)
        return rows, starts, series

    ds = epoch_groups(sampler)
    # one group read at a time (bounded memory), ahead of the cuts of the previous one;
    # from object storage several, so that request latency overlaps
    ahead = REMOTE_GROUPS_AHEAD if remote else 1
    return ds.map(load, num_parallel_calls=ahead, deterministic=True)
