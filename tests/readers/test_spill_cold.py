"""A spill read cold (dropped from the page cache: ``HeldRows.evict``) gives
exactly the batches it gives warm and held in memory, whether its pages are
asked for ahead (:class:`windowkit.readers.rows.held.SpillPrefetch`)
or faulted in one by one; and a warm spill's are not."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import windowkit as wk
from windowkit.errors import InvalidSpecError
from windowkit.readers import BatchOptions, ShuffleOptions
from windowkit.readers.epoch.batches import EpochBatches
from windowkit.readers.rows import held as held_module

SPEC = wk.WindowSpec(length=32, horizon=3, stride=1)
TINY = 4096  # bytes of memory_budget: far below the store's rows, so they are spilled
BATCH = 96


@pytest.fixture
def store(tmp_path: Path) -> wk.Store:
    """Four series of numbered rows (column 0: the global row), a few hundred KB."""
    series, first = [], 0
    for n in (2600, 1900, 3100, 700):
        rows = np.random.default_rng(n).standard_normal((n, 16)).astype(np.float32)
        rows[:, 0] = np.arange(first, first + n)
        series.append(rows)
        first += n
    return wk.convert(series, tmp_path / "store", format="zarr", window=SPEC, block_rows=256)


def _batches(store: wk.Store, tmp_path: Path, budget: int | None) -> EpochBatches:
    plan = store.read_plan("train")
    budget = 4 * plan.rows_bytes() if budget is None else budget
    batches = EpochBatches(plan, BatchOptions(BATCH),
                           ShuffleOptions("global", seed=5, memory_budget=budget,
                                          spill_dir=tmp_path))
    batches.hold()
    return batches


def _epoch(batches: EpochBatches, epoch: int) -> list[tuple[np.ndarray, np.ndarray]]:
    return [batches.batch_at(epoch, i) for i in range(batches.batches_in(epoch))]


def _assert_same(got: list[tuple[np.ndarray, np.ndarray]],
                 expected: list[tuple[np.ndarray, np.ndarray]]) -> None:
    assert len(got) == len(expected)
    for (x, y), (ex, ey) in zip(got, expected, strict=True):
        np.testing.assert_array_equal(x, ex)
        np.testing.assert_array_equal(y, ey)


def _cold_resident(held: held_module.HeldRows) -> bool:
    """Whether the spill stayed in the page cache though evicted (a file system
    held in memory, such as tmpfs)."""
    prefetch = held.prefetch
    assert prefetch is not None
    rows = len(held.rows)
    return prefetch._resident(np.arange(0, rows, max(1, rows // 16), dtype=np.int64))


@pytest.mark.parametrize("mode", ["auto", "always", "never"])
def test_a_cold_spill_gives_the_batches_of_a_warm_one_and_of_memory(
        store: wk.Store, tmp_path: Path, mode: str) -> None:
    in_memory = _batches(store, tmp_path, None)
    assert not in_memory.held_rows().spilled and in_memory.held_rows().prefetch is None
    spilled = _batches(store, tmp_path, TINY)
    held = spilled.held_rows()
    assert held.spilled and held.prefetch is not None
    held.prefetch.mode = mode
    for epoch in (0, 1):
        expected = _epoch(in_memory, epoch)
        held.evict()
        cold_resident = _cold_resident(held)
        before = held.prefetch.prefetched
        _assert_same(_epoch(spilled, epoch), expected)  # cold
        cold_reads = held.prefetch.prefetched - before
        _assert_same(_epoch(spilled, epoch), expected)  # warm
        warm_reads = held.prefetch.prefetched - before - cold_reads
        batches = spilled.batches_in(epoch)
        if mode == "always":
            assert cold_reads == warm_reads == batches
        elif mode == "never":
            assert cold_reads == warm_reads == 0
        else:
            assert warm_reads == 0  # in the page cache: not read ahead
            if not cold_resident:
                assert cold_reads > 0


def test_prefetch_reads_the_pages_of_every_window(store: wk.Store, tmp_path: Path) -> None:
    """The runs asked for cover every byte of every window's rows, within the
    file, each page once."""
    held = _batches(store, tmp_path, TINY).held_rows()
    prefetch = held.prefetch
    assert prefetch is not None
    at = np.random.default_rng(0).integers(0, len(held.rows) - SPEC.span + 1, 500)
    at = np.sort(at)
    offsets, lengths = prefetch._runs(at)
    assert np.all(lengths > 0) and np.all(offsets % held_module.PAGE == 0)
    assert np.all(np.diff(offsets) > lengths[:-1])  # ascending, apart: merged
    assert offsets[-1] + lengths[-1] <= prefetch.pages * held_module.PAGE
    covered = np.zeros(prefetch.pages * held_module.PAGE, dtype=bool)
    for offset, length in zip(offsets, lengths, strict=True):
        covered[offset:offset + length] = True
    for start in at:
        assert covered[start * prefetch.row_bytes:(start + SPEC.span) * prefetch.row_bytes].all()


def test_a_read_error_is_the_spill_s_one_line(store: wk.Store, tmp_path: Path) -> None:
    """An OS error asking for the pages (here: of a pipe, which cannot be read
    ahead) is one line naming the spill directory."""
    held = _batches(store, tmp_path, TINY).held_rows()
    prefetch = held.prefetch
    assert prefetch is not None
    prefetch.mode = "always"
    read, write = os.pipe()
    try:
        prefetch.fd = read
        with pytest.raises(InvalidSpecError, match=f"{tmp_path}: cannot spill ") as caught:
            held.windows(np.array([0, 40, 900], dtype=np.int64))
    finally:
        os.close(read)
        os.close(write)
    assert "\n" not in str(caught.value) and "Errno" not in str(caught.value)


def test_a_warm_spill_is_checked_now_and_then(store: wk.Store, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Resident, the checks thin out (at most one in RESIDENCY_SKIP gathers);
    evicted, the next gather is checked again and its pages asked for."""
    held = _batches(store, tmp_path, TINY).held_rows()
    prefetch = held.prefetch
    assert prefetch is not None
    checks: list[bool] = []
    check = prefetch._resident
    monkeypatch.setattr(prefetch, "_resident", lambda at: checks.append(check(at)) or checks[-1])
    at = np.arange(0, 3000, 7, dtype=np.int64)
    held.windows(at)  # in the page cache: just written
    for _ in range(299):
        held.windows(at)
    assert 5 <= len(checks) <= 12 and all(checks)
    assert prefetch.prefetched == 0
    held.evict()
    if _cold_resident(held):
        pytest.skip("the spill stays in the page cache when dropped (tmpfs)")
    held.windows(at)
    assert checks[-1] is False and prefetch.prefetched == 1
