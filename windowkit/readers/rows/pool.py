"""Cut batches of windows from storage blocks with one vectorized gather.

A :class:`BlockPool` keeps decoded storage blocks in one preallocated array.
Each slot holds a block *plus a halo* of the ``span - 1`` rows that follow it,
so every window whose start lies in a block is cut from that one slot, whatever
block or series boundary it crosses. A batch is then one strided fancy index
(``view[slot_starts]``), with no Python per window.
"""

from __future__ import annotations

import pickle
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from windowkit.errors import StoreError
from windowkit.formats.base import RowReader
from windowkit.layout import RowLayout
from windowkit.readers.windows import cut_from_views, window_views
from windowkit.spec import WindowSpec

DEFAULT_CACHE_BYTES = 24 << 20

#: Threads that read and decode blocks for a pool. Each ``acquire`` that misses
#: blocks hands them to one loader thread, so a slow read delays only the callers
#: that need its block, and different callers' blocks load in parallel. Reads
#: stay off the callers' threads (Keras workers, tf.data threads running
#: ``numpy_function``s) so that decoders' per-thread caches (zstd contexts, Arrow
#: and malloc arenas) exist at most this many times, not once per caller thread;
#: threads start only when that many loads overlap, so one caller at a time
#: keeps one loader thread, as before.
LOADER_THREADS = 4


class _LoaderReaders:
    """The reader each loader thread reads with.

    Format readers keep open file handles (seeked, then read) and small caches,
    so they are not safe to share between threads: each loader thread reads
    with its own :meth:`~windowkit.formats.RowReader.clone`. A reader that
    declares ``thread_safe`` is shared as is; one that cannot be cloned is
    shared behind a lock, so its reads run one at a time.
    """

    def __init__(self, reader: RowReader) -> None:
        self._reader = reader
        self._shared = reader.thread_safe
        self._lock = threading.Lock()
        self._original_taken = False
        self._local = threading.local()

    def read_rows(self, start: int, stop: int) -> np.ndarray:
        reader: Any = getattr(self._local, "reader", None)
        if reader is None:
            reader = self._local.reader = self._own_reader()
        if reader is self._reader and not self._shared:  # maybe shared: no copy pickled
            with self._lock:
                return np.asarray(reader.read_rows(start, stop))
        return np.asarray(reader.read_rows(start, stop))

    def _own_reader(self) -> Any:
        if self._shared:
            return self._reader
        with self._lock:
            if not self._original_taken:  # the first loader thread reads with the original
                self._original_taken = True
                return self._reader
        try:
            return self._reader.clone()
        except (pickle.PicklingError, TypeError, AttributeError):  # share, one read at a time
            return self._reader


class BlockPool:
    """A fixed number of slots of decoded blocks, evicted least recently used.

    Slots in use by a gather are pinned and never evicted; a caller waits,
    holding no pins, until all the blocks it needs can be pinned together.
    The lock guards bookkeeping only: a caller reserves slots for its missing
    blocks and marks them loading, then they are read and decoded on a loader
    thread (:data:`LOADER_THREADS`) with no lock held, and published one by
    one. A caller that needs a block being loaded waits for that load; if it
    fails, the block is free again and the next caller loads it anew.
    """

    def __init__(self, reader: RowReader, layout: RowLayout, *, halo: int,
                 cache_bytes: int) -> None:
        self.reader = reader
        self.block_rows = layout.block_rows
        self.slot_rows = self.block_rows + halo
        self.total_rows = layout.total_rows
        self.num_blocks = num_blocks = layout.num_blocks
        slot_bytes = self.slot_rows * layout.row_bytes
        self.capacity = int(max(2, min(num_blocks, cache_bytes // slot_bytes)))
        self.data = np.zeros((self.capacity * self.slot_rows, *layout.step_shape),
                             dtype=layout.dtype)
        self._slot_of: OrderedDict[int, int] = OrderedDict()  # block -> slot, LRU first
        self._loading: set[int] = set()  # blocks whose reserved slot is being filled
        self._pins = np.zeros(self.capacity, dtype=np.int64)
        self._free = list(range(self.capacity - 1, -1, -1))
        self._cond = threading.Condition()
        self._readers = _LoaderReaders(reader)
        self._loader = ThreadPoolExecutor(max_workers=LOADER_THREADS,
                                          thread_name_prefix="windowkit-load")

    def __getstate__(self) -> dict[str, object]:
        raise TypeError("a BlockPool holds decoded data and does not pickle; pickle the Store")

    def acquire(self, blocks: np.ndarray) -> np.ndarray:
        """Pin ``blocks`` (unique ids), loading missing ones; return their slots.

        All or nothing: a caller waits, holding no pins, until every block it
        asks for can be pinned at once (and none is being loaded by another
        caller). Pinning block by block would let threads that each hold part
        of what they need wait for one another.
        """
        if len(blocks) > self.capacity:
            raise ValueError(f"{len(blocks)} blocks requested, pool holds {self.capacity}")
        wanted = blocks.tolist()
        slots = np.empty(len(wanted), dtype=np.int64)
        resident: list[int] = []
        jobs: list[tuple[int, int]] = []  # (block, reserved slot) to load
        with self._cond:
            while not self._can_pin(wanted):
                self._cond.wait()
            missing = []
            for i, block in enumerate(wanted):  # resident blocks first: never evicted below
                slot = self._slot_of.get(block)
                if slot is None:
                    missing.append(i)
                    continue
                self._slot_of.move_to_end(block)
                self._pins[slot] += 1
                slots[i] = slot
                resident.append(slot)
            for i in missing:
                slot = self._take_slot()
                self._pins[slot] += 1
                self._loading.add(wanted[i])
                slots[i] = slot
                jobs.append((wanted[i], slot))
        if not jobs:
            return slots
        loaded: list[int] = []  # slots the loader published for this call
        try:
            future = self._loader.submit(self._load, jobs, loaded)
        except BaseException:  # e.g. at interpreter shutdown: nothing was loaded
            self._give_back(jobs)
            self.release(np.array(resident, dtype=np.int64))
            raise
        try:
            error = future.exception()
        except BaseException:  # interrupted: the loads go on; unpin once they are done
            future.add_done_callback(lambda _: self.release(np.array(resident + loaded)))
            raise
        if error is not None:  # failed loads gave back their slots and pins already
            self.release(np.array(resident + loaded, dtype=np.int64))
            raise error
        return slots

    def release(self, slots: np.ndarray) -> None:
        with self._cond:
            np.subtract.at(self._pins, slots.astype(np.int64, copy=False), 1)
            self._cond.notify_all()

    def _can_pin(self, wanted: list[int]) -> bool:
        """Whether no block of ``wanted`` is being loaded, and slots for every
        one not resident are free (or evictable) now."""
        if self._loading and not self._loading.isdisjoint(wanted):
            return False
        missing = sum(1 for block in wanted if block not in self._slot_of)
        if missing <= len(self._free):
            return True
        wanted_set = set(wanted)
        evictable = sum(1 for block, slot in self._slot_of.items()
                        if self._pins[slot] == 0 and block not in wanted_set)
        return missing <= len(self._free) + evictable

    def _take_slot(self) -> int:
        """A free slot, else the least recently used unpinned one (``_can_pin`` holds)."""
        if self._free:
            return self._free.pop()
        for block, slot in self._slot_of.items():
            if self._pins[slot] == 0:
                del self._slot_of[block]
                return slot
        raise AssertionError("no unpinned slot although _can_pin said so")

    def _load(self, jobs: list[tuple[int, int]], loaded: list[int]) -> None:
        """Fill the reserved slots of ``jobs`` in turn (on a loader thread, no lock
        held), publishing each block once its slot is whole. On an error the
        slots not filled are given back, with the caller's pins on them."""
        for n, (block, slot) in enumerate(jobs):
            try:
                self._fill(block, slot)
            except BaseException:
                self._give_back(jobs[n:])
                raise
            with self._cond:
                self._loading.discard(block)
                self._slot_of[block] = slot
                loaded.append(slot)
                self._cond.notify_all()

    def _give_back(self, jobs: list[tuple[int, int]]) -> None:
        """Free the reserved slots of ``jobs`` not filled, with the caller's pins
        on them, and wake the callers waiting for those blocks (they load them)."""
        with self._cond:
            for block, slot in jobs:
                self._loading.discard(block)
                self._pins[slot] -= 1
                self._free.append(slot)
            self._cond.notify_all()

    def _fill(self, block: int, slot: int) -> None:
        """Read ``block`` and its halo into ``slot``; a short read is a StoreError."""
        start = block * self.block_rows
        stop = min(self.total_rows, start + self.slot_rows)
        rows = self._readers.read_rows(start, stop)
        where = f"block {block} (rows {start}..{stop})"
        if len(rows) != stop - start:
            raise StoreError(f"{where}: the store returned {len(rows)} rows, "
                             f"expected {stop - start}")
        if rows.shape[1:] != self.data.shape[1:]:
            raise StoreError(f"{where}: the store returned rows of shape {rows.shape[1:]}, "
                             f"expected {self.data.shape[1:]}")
        base = slot * self.slot_rows
        self.data[base:base + len(rows)] = rows


class WindowGather:
    """Cuts windows (and horizon targets) from a pool, batch by batch."""

    def __init__(self, reader: RowReader, layout: RowLayout, *, spec: WindowSpec,
                 cache_bytes: int = DEFAULT_CACHE_BYTES,
                 targets: np.ndarray | None = None) -> None:
        self.spec = spec
        self.targets = targets  # the columns targets keep (None: all)
        self.pool = BlockPool(reader, layout, halo=spec.span - 1, cache_bytes=cache_bytes)
        self._views = window_views(self.pool.data, spec)  # every window of every slot

    def __call__(self, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Windows starting at global rows ``starts``: ``(x, y)``, ``y`` None if H=0."""
        return self.cut(starts, self.targets)

    def cut(self, starts: np.ndarray, targets: np.ndarray | None
            ) -> tuple[np.ndarray, np.ndarray | None]:
        """``(x, y)`` of the windows starting at global rows ``starts``, ``y``
        holding the ``targets`` columns (None: every column)."""
        starts = np.asarray(starts, dtype=np.int64)
        block = starts // self.pool.block_rows
        unique, inverse = np.unique(block, return_inverse=True)
        limit = max(1, self.pool.capacity // 2)
        if len(unique) <= limit:
            return self._cut_pinned(starts, block, unique, inverse, targets)
        # more blocks than one pass may pin: cut in groups of blocks
        data, spec = self.pool.data, self.spec
        x = np.empty((len(starts), spec.length, *data.shape[1:]), dtype=data.dtype)
        y = None
        if spec.horizon:
            y_shape = data.shape[1:] if targets is None else (len(targets),)
            y = np.empty((len(starts), spec.horizon, *y_shape), dtype=data.dtype)
        for lo in range(0, len(unique), limit):
            members = np.flatnonzero((inverse >= lo) & (inverse < lo + limit))
            group_x, group_y = self._cut_pinned(starts[members], block[members],
                                                unique[lo:lo + limit], inverse[members] - lo,
                                                targets)
            x[members] = group_x
            if y is not None and group_y is not None:
                y[members] = group_y
        return x, y

    def _cut_pinned(self, starts: np.ndarray, block: np.ndarray, unique: np.ndarray,
                    inverse: np.ndarray, targets: np.ndarray | None
                    ) -> tuple[np.ndarray, np.ndarray | None]:
        """:meth:`cut` for windows in blocks ``unique`` (few enough to pin at once)."""
        slots = self.pool.acquire(unique)
        try:
            at = slots[inverse] * self.pool.slot_rows + (starts - block * self.pool.block_rows)
            return cut_from_views(self._views, at, targets)
        finally:
            self.pool.release(slots)
