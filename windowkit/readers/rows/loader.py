"""Reading groups of blocks, each with its halo, into one array of rows: the
NumPy side of block groups (``tf.data`` calls it once per group) and of
holding a split's rows for a uniform shuffle."""

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
from windowkit.location import is_remote

if TYPE_CHECKING:
    from windowkit.readers.plan import ReadPlan

REMOTE_READERS = 8  # ranges read at once from object storage
HEAD_CACHE_BYTES = 32 << 20  # the first rows of blocks read: later halos need no read


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
        for k, part in enumerate(parts):  # a short read would shift every later block
            first, last = int(blocks[heads[k]]), int(blocks[ends[k] - 1])
            if len(part) != stops[k] - lo[k]:
                which = f"block {first}" if first == last else f"blocks {first}..{last}"
                raise StoreError(f"{which} (rows {lo[k]}..{hi[k]}): the store returned "
                                 f"{len(part)} rows, expected {hi[k] - lo[k]}")
            self._keep_heads(part, int(lo[k]), range(first, last + 2))
        return _joined(parts, known, run_offset), offsets


def _joined(parts: list[np.ndarray], heads: list[np.ndarray | None],
            run_offset: np.ndarray) -> np.ndarray:
    """The runs' rows, each followed by its known head (if any), as one array:
    a lone run as it is, else each part copied once into its place."""
    if len(parts) == 1 and heads[0] is None:
        return parts[0]
    rows = np.empty((int(run_offset[-1]), *parts[0].shape[1:]), dtype=parts[0].dtype)
    for part, head, at in zip(parts, heads, run_offset[:-1].tolist(), strict=True):
        rows[at:at + len(part)] = part
        if head is not None:
            rows[at + len(part):at + len(part) + len(head)] = head
    return rows
