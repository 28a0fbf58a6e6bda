"""``BlockPool``: the Keras reader's cache of decoded blocks, shared by threads.

Rows are their own global row numbers, so any slot's content can be checked.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np
import pytest

from windowkit.errors import StoreError
from windowkit.formats.base import RowReader
from windowkit.layout import RowLayout
from windowkit.readers import BlockPool, WindowGather
from windowkit.readers.rows.loader import GroupLoader
from windowkit.spec import WindowSpec

BLOCK_ROWS = 4
TOTAL_ROWS = 400
LAYOUT = RowLayout(np.dtype(np.float32), (1,), TOTAL_ROWS, BLOCK_ROWS)


class NumberedRows(RowReader):
    """Row ``r`` is ``[r]``; sleeps a little per read so threads interleave."""

    block_rows = BLOCK_ROWS

    def __init__(self, fail_block: int | None = None) -> None:
        self.fail_block = fail_block

    def read_rows(self, start: int, stop: int) -> np.ndarray:
        time.sleep(0.0005)
        if self.fail_block is not None and start // BLOCK_ROWS == self.fail_block:
            raise StoreError(f"block {self.fail_block} is damaged")
        return np.arange(start, stop, dtype=np.float32)[:, None]


def _pool(reader: RowReader, capacity: int) -> BlockPool:
    slot_bytes = (BLOCK_ROWS + 1) * 4
    return BlockPool(reader, LAYOUT, halo=1, cache_bytes=capacity * slot_bytes)


def _check_slots(pool: BlockPool, blocks: np.ndarray, slots: np.ndarray) -> None:
    for block, slot in zip(blocks.tolist(), slots.tolist(), strict=True):
        first = pool.data[slot * pool.slot_rows, 0]
        assert first == block * BLOCK_ROWS


def _hammer(pool: BlockPool, *, rounds: int, blocks_per_call: int, threads: int = 4,
            seconds: float = 30) -> list[BaseException]:
    """``threads`` threads acquiring random blocks ``rounds`` times each and
    checking what they got; returns their errors (a hang fails the test)."""
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(rounds):
                blocks = rng.choice(pool.num_blocks, size=blocks_per_call, replace=False)
                slots = pool.acquire(blocks)
                try:
                    _check_slots(pool, blocks, slots)
                finally:
                    pool.release(slots)
        except BaseException as exc:  # reported by the caller
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(seed,), daemon=True)
               for seed in range(threads)]
    for thread in workers:
        thread.start()
    deadline = time.monotonic() + seconds
    for thread in workers:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    assert not any(thread.is_alive() for thread in workers), "threads deadlocked on the pool"
    return errors


def test_threads_needing_many_blocks_never_wait_on_each_other() -> None:
    """Each thread needs most of a small pool at once: pinning block by block
    deadlocked here (every thread holding part of its blocks, waiting for more)."""
    pool = _pool(NumberedRows(), capacity=6)
    assert pool.capacity == 6
    errors = _hammer(pool, rounds=60, blocks_per_call=3)
    assert not errors, errors
    assert not pool._pins.any()


def test_a_failed_load_gives_back_its_slots_and_pins() -> None:
    pool = _pool(NumberedRows(fail_block=7), capacity=4)
    for _ in range(10):  # without giving back, the pool would run dry and hang
        with pytest.raises(StoreError, match="block 7"):
            pool.acquire(np.array([1, 2, 7]))
    assert not pool._pins.any()
    blocks = np.array([3, 4, 5, 6])
    slots = pool.acquire(blocks)
    _check_slots(pool, blocks, slots)
    pool.release(slots)


def test_more_blocks_than_the_pool_holds_is_refused() -> None:
    pool = _pool(NumberedRows(), capacity=3)
    with pytest.raises(ValueError, match="pool holds 3"):
        pool.acquire(np.arange(4))


# -- reads run outside the pool's lock --------------------------------------------------
class GatedRows(RowReader):
    """Row ``r`` is ``[r]``; reads of ``slow_block`` wait for ``go`` (at most
    ``hold`` s). Counts reads per block; ``fail_once`` blocks fail on their first
    read, ``short`` blocks come back one row short. Safe to share between threads."""

    block_rows = BLOCK_ROWS
    thread_safe = True

    def __init__(self, slow_block: int | None = None, hold: float = 1.5, *,
                 fail_once: tuple[int, ...] = (), short: tuple[int, ...] = ()) -> None:
        self.slow_block, self.hold = slow_block, hold
        self.fail_once, self.short = set(fail_once), set(short)
        self.started, self.go = threading.Event(), threading.Event()
        self.reads: dict[int, int] = {}
        self._lock = threading.Lock()

    def read_rows(self, start: int, stop: int) -> np.ndarray:
        block = start // BLOCK_ROWS
        with self._lock:
            self.reads[block] = self.reads.get(block, 0) + 1
            fail = block in self.fail_once and self.reads[block] == 1
        if block == self.slow_block:
            self.started.set()
            self.go.wait(self.hold)
        if fail:
            raise StoreError(f"block {block}: transient read error")
        if block in self.short:
            stop -= 1
        return np.arange(start, stop, dtype=np.float32)[:, None]


def _gather(reader: GatedRows, capacity: int = 8) -> WindowGather:
    slot_bytes = (BLOCK_ROWS + 1) * 4
    return WindowGather(reader, LAYOUT, spec=WindowSpec(2), cache_bytes=capacity * slot_bytes)


def _check_windows(x: np.ndarray, starts: np.ndarray) -> None:
    np.testing.assert_array_equal(x[:, :, 0], starts[:, None] + np.arange(2))


def _in_thread(fn: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    """Run ``fn`` on a daemon thread; its result or exception lands in the list."""
    out: list[object] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # reported by the test
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_a_slow_read_stalls_neither_resident_gathers_nor_other_loads() -> None:
    reader = GatedRows(slow_block=10)
    gather = _gather(reader)
    resident = np.array([4, 5, 6])  # block 1, loaded before the slow read starts
    _check_windows(gather(resident)[0], resident)
    slow = np.array([40, 41])  # block 10: its read waits for `go`
    thread, out = _in_thread(lambda: gather(slow)[0])
    try:
        assert reader.started.wait(5), "the slow read never started"
        began = time.monotonic()
        _check_windows(gather(resident)[0], resident)
        resident_s = time.monotonic() - began
        other = np.array([80, 81, 82])  # block 20, not resident: loads meanwhile
        began = time.monotonic()
        _check_windows(gather(other)[0], other)
        other_s = time.monotonic() - began
        slow_done_meanwhile = bool(out)
    finally:
        reader.go.set()
        thread.join(5)
    assert resident_s < 0.5, f"a resident block waited {resident_s:.2f} s for a slow read"
    assert other_s < 0.5, f"another block's load waited {other_s:.2f} s for a slow read"
    assert not slow_done_meanwhile, "the slow read ended early: the test proves nothing"
    assert len(out) == 1 and isinstance(out[0], np.ndarray), out
    _check_windows(out[0], slow)
    assert not gather.pool._pins.any()


def test_threads_needing_the_same_missing_block_load_it_once() -> None:
    reader = GatedRows(slow_block=7, hold=0.3)
    gather = _gather(reader)
    starts = np.array([28, 29, 30])
    barrier = threading.Barrier(3)

    def work() -> np.ndarray:
        barrier.wait()
        return gather(starts)[0]

    threads = [_in_thread(work) for _ in range(3)]
    for thread, _ in threads:
        thread.join(5)
    for _, out in threads:
        assert len(out) == 1 and isinstance(out[0], np.ndarray), out
        _check_windows(out[0], starts)
    assert reader.reads == {7: 1}
    assert not gather.pool._pins.any()


def test_a_failed_load_wakes_its_waiters_who_load_it_again() -> None:
    """The loading thread gets the error; a thread that waited for that load
    loads the block itself (no stale slot); every slot and pin is given back."""
    reader = GatedRows(slow_block=9, fail_once=(9,))
    gather = _gather(reader, capacity=4)
    starts = np.array([36, 37])
    first, first_out = _in_thread(lambda: gather(starts)[0])
    assert reader.started.wait(5)
    second, second_out = _in_thread(lambda: gather(starts)[0])
    time.sleep(0.1)  # the second thread now waits for the first one's load
    reader.go.set()
    first.join(5)
    second.join(5)
    assert len(first_out) == 1 and isinstance(first_out[0], StoreError), first_out
    assert "block 9" in str(first_out[0])
    assert len(second_out) == 1 and isinstance(second_out[0], np.ndarray), second_out
    _check_windows(second_out[0], starts)
    assert reader.reads[9] == 2
    pool = gather.pool
    assert not pool._pins.any() and not pool._loading
    assert len(pool._free) + len(pool._slot_of) == pool.capacity
    blocks = np.array([1, 2, 3, 9])  # the whole pool: nothing was lost
    slots = pool.acquire(blocks)
    _check_slots(pool, blocks, slots)
    pool.release(slots)


def test_a_short_read_is_a_store_error() -> None:
    pool = _pool(GatedRows(short=(7,)), capacity=4)
    with pytest.raises(StoreError, match=r"^block 7 \(rows 28\.\.33\): the store returned 4 "
                                         r"rows, expected 5$"):
        pool.acquire(np.array([2, 7]))
    assert not pool._pins.any() and not pool._loading
    blocks = np.array([2, 3, 4, 5])
    slots = pool.acquire(blocks)
    _check_slots(pool, blocks, slots)
    pool.release(slots)


def test_group_loader_refuses_a_short_read() -> None:
    loader = GroupLoader(GatedRows(short=(4,)), total_rows=TOTAL_ROWS, halo=1)
    rows, offsets = loader(np.array([1, 2]))
    assert rows[:, 0].tolist() == list(range(4, 13)) and offsets.tolist() == [0, 4]
    with pytest.raises(StoreError, match=r"^blocks 4\.\.5 \(rows 16\.\.25\): the store "
                                         r"returned 8 rows, expected 9$"):
        loader(np.array([1, 4, 5]))


class OneReadAtATime(NumberedRows):
    """A reader like the formats' (a shared file handle: seek, then read), which
    fails if two threads read through one instance at once."""

    def __init__(self, picklable: bool) -> None:
        super().__init__()
        self._busy = False
        if not picklable:
            self._handle = threading.Lock()  # does not pickle: the pool cannot copy it

    def read_rows(self, start: int, stop: int) -> np.ndarray:
        if self._busy:
            raise AssertionError("two threads read through one reader at once")
        self._busy = True
        try:
            time.sleep(0.005)
            return super().read_rows(start, stop)
        finally:
            self._busy = False


@pytest.mark.parametrize("picklable", [True, False], ids=["copied", "shared"])
def test_loader_threads_never_share_a_reader_at_once(picklable: bool) -> None:
    """Each loader thread reads with its own copy of the reader, or, when the
    reader does not pickle, with the original one read at a time."""
    pool = _pool(OneReadAtATime(picklable), capacity=12)
    errors = _hammer(pool, rounds=15, blocks_per_call=2)
    assert not errors, errors
    assert not pool._pins.any()


class RangeLog(NumberedRows):
    """Numbered rows that record every range read."""

    def __init__(self) -> None:
        super().__init__()
        self.ranges: list[tuple[int, int]] = []

    def read_rows(self, start: int, stop: int) -> np.ndarray:
        self.ranges.append((start, stop))
        return super().read_rows(start, stop)


def test_group_loader_takes_a_halo_from_a_block_it_read_before() -> None:
    """A halo is the next block's first rows: once that block was read, a later
    group's halo comes from what was kept, not from another read; the rows are
    the same either way."""
    reader = RangeLog()
    loader = GroupLoader(reader, total_rows=TOTAL_ROWS, halo=2)
    rows, _ = loader(np.array([5]))  # block 5 and its halo, the head of block 6
    assert reader.ranges == [(20, 26)] and rows[:, 0].tolist() == list(range(20, 26))
    rows, offsets = loader(np.array([4, 9]))  # block 4's halo is block 5's head
    assert reader.ranges[1:] == [(16, 20), (36, 42)]
    assert rows[:, 0].tolist() == [*range(16, 22), *range(36, 42)]
    assert offsets.tolist() == [0, 6]
    rows, _ = loader(np.array([3]))  # block 4 was read above: its head is reused
    assert reader.ranges[3:] == [(12, 16)] and rows[:, 0].tolist() == list(range(12, 18))
