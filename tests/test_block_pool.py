"""``BlockPool``: the Keras reader's cache of decoded blocks, shared by threads.

Rows are their own global row numbers, so any slot's content can be checked.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from windowkit.errors import StoreError
from windowkit.gather import BlockPool

BLOCK_ROWS = 4
TOTAL_ROWS = 400


class NumberedRows:
    """Row ``r`` is ``[r]``; sleeps a little per read so threads interleave."""

    block_rows = BLOCK_ROWS

    def __init__(self, fail_block: int | None = None) -> None:
        self.fail_block = fail_block

    def read_rows(self, start: int, stop: int) -> np.ndarray:
        time.sleep(0.0005)
        if self.fail_block is not None and start // BLOCK_ROWS == self.fail_block:
            raise StoreError(f"block {self.fail_block} is damaged")
        return np.arange(start, stop, dtype=np.float32)[:, None]


def _pool(reader: NumberedRows, capacity: int) -> BlockPool:
    slot_bytes = (BLOCK_ROWS + 1) * 4
    return BlockPool(reader, total_rows=TOTAL_ROWS, halo=1, step_shape=(1,),
                     dtype=np.dtype(np.float32), cache_bytes=capacity * slot_bytes)


def _check_slots(pool: BlockPool, blocks: np.ndarray, slots: np.ndarray) -> None:
    for block, slot in zip(blocks.tolist(), slots.tolist(), strict=True):
        first = pool.data[slot * pool.slot_rows, 0]
        assert first == block * BLOCK_ROWS


def test_threads_needing_many_blocks_never_wait_on_each_other() -> None:
    """Each thread needs most of a small pool at once: pinning block by block
    deadlocked here (every thread holding part of its blocks, waiting for more)."""
    pool = _pool(NumberedRows(), capacity=6)
    assert pool.capacity == 6
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(60):
                blocks = rng.choice(pool.num_blocks, size=3, replace=False)
                slots = pool.acquire(blocks)
                try:
                    _check_slots(pool, blocks, slots)
                finally:
                    pool.release(slots)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(seed,), daemon=True) for seed in range(4)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 30
    for thread in threads:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    assert not any(thread.is_alive() for thread in threads), "threads deadlocked on the pool"
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
