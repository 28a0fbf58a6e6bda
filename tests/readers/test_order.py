"""Epoch orders: every window once, random access by position, seeded, compact."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from windowkit.errors import InvalidSpecError
from windowkit.index import WindowRuns
from windowkit.readers import WindowOrder, block_first_positions, index_shuffle


def _runs(series_starts: list[np.ndarray], rows: list[int], stride: int) -> WindowRuns:
    """Runs of equally spaced starts, built the plain way from per-series starts."""
    series, first, count = [], [], []
    for sid, starts in enumerate(series_starts):
        for start in starts.tolist():
            if series and series[-1] == sid and first[-1] + count[-1] * stride == start:
                count[-1] += 1
            else:
                series.append(sid)
                first.append(start)
                count.append(1)
    offsets = np.concatenate([[0], np.cumsum(rows)[:-1]]).astype(np.int64)
    return WindowRuns(np.array(series, dtype=np.int32), np.array(first, dtype=np.int64),
                      np.array(count, dtype=np.int64), stride, offsets)


@st.composite
def layouts(draw: st.DrawFn) -> tuple[WindowRuns, np.ndarray, int, int]:
    """Runs with gaps (as ``--nan skip`` leaves), their global starts, block rows, rows."""
    stride = draw(st.integers(1, 3))
    rows = draw(st.lists(st.integers(1, 60), min_size=1, max_size=5))
    starts = []
    for n in rows:
        candidates = np.arange(0, n, stride, dtype=np.int64)
        keep = draw(st.lists(st.booleans(), min_size=len(candidates), max_size=len(candidates)))
        starts.append(candidates[np.array(keep, dtype=bool)])
    runs = _runs(starts, rows, stride)
    offsets = np.concatenate([[0], np.cumsum(rows)[:-1]])
    expected = np.concatenate([s + o for s, o in zip(starts, offsets, strict=True)])
    return runs, expected.astype(np.int64), draw(st.integers(1, 20)), sum(rows)


def test_index_shuffle_is_a_bijection_for_every_size() -> None:
    for size in [*range(1, 130), 1000, 1025, 4096, 65537]:
        for key in (0, 1, 2**64 - 1):
            out = index_shuffle(np.arange(size), size, np.uint64(key))
            np.testing.assert_array_equal(np.sort(out), np.arange(size))
    # mixed sizes and keys in one call equal one call per element
    sizes = np.array([1, 2, 3, 7, 100, 5000, 3], dtype=np.int64)
    keys = np.array([5, 6, 7, 8, 9, 10, 7], dtype=np.uint64)
    index = np.array([0, 1, 2, 6, 50, 4999, 2], dtype=np.int64)
    single = [index_shuffle(index[i:i + 1], sizes[i], keys[i])[0] for i in range(len(index))]
    np.testing.assert_array_equal(index_shuffle(index, sizes, keys), single)


def test_index_shuffle_looks_random() -> None:
    size = 1000
    perms = [index_shuffle(np.arange(size), size, np.uint64(key)) for key in range(50)]
    correlation = [abs(np.corrcoef(np.arange(size), p)[0, 1]) for p in perms]
    assert np.mean(correlation) < 0.06
    assert len({p.tobytes() for p in perms}) == 50
    # where position 0 goes is close to uniform over a small range
    counts = np.bincount([index_shuffle([0], 10, np.uint64(k))[0] for k in range(3000)],
                         minlength=10)
    assert counts.min() > 220 and counts.max() < 380, counts


@given(data=layouts())
def test_block_first_positions_count_the_starts_of_each_block(data: tuple) -> None:
    runs, expected, block_rows, total_rows = data
    num_blocks = -(-total_rows // block_rows)
    first = block_first_positions(runs, block_rows=block_rows, num_blocks=num_blocks)
    counts = np.bincount(expected // block_rows, minlength=num_blocks)
    np.testing.assert_array_equal(first, np.concatenate([[0], np.cumsum(counts)]))


@given(data=layouts(), blocks_per_group=st.integers(1, 8), seed=st.integers(0, 2**32),
       epoch=st.integers(0, 3), shuffle=st.booleans())
def test_epoch_is_a_permutation_with_random_access(data: tuple, blocks_per_group: int,
                                                   seed: int, epoch: int,
                                                   shuffle: bool) -> None:
    runs, expected, block_rows, total_rows = data
    order = WindowOrder(runs, shuffle=shuffle, seed=seed, block_rows=block_rows,
                        total_rows=total_rows, blocks_per_group=blocks_per_group).epoch(epoch)
    total = len(expected)
    starts = order.starts(0, total)
    np.testing.assert_array_equal(np.sort(starts), expected)
    if not shuffle:
        np.testing.assert_array_equal(starts, expected)
    # any slice, asked for in any order, is the same slice of the whole epoch
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.integers(0, total + 1, size=6))
    for lo, hi in itertools.pairwise(cuts.tolist()):
        np.testing.assert_array_equal(order.starts(int(lo), int(hi)), starts[lo:hi])
    # windows are mixed only within groups: blocks whose epoch positions interleave
    # form clusters of at most blocks_per_group blocks
    if total:
        block = starts // block_rows
        ids, first_pos = np.unique(block, return_index=True)
        last_pos = total - 1 - np.unique(block[::-1], return_index=True)[1]
        spans = sorted(zip(first_pos.tolist(), last_pos.tolist(), strict=True))
        cluster, reach = 1, spans[0][1]
        for lo, hi in spans[1:]:
            cluster = cluster + 1 if lo < reach else 1
            reach = max(reach, hi)
            assert cluster <= blocks_per_group
        assert len(ids) == len(spans)



def test_groups_keep_reads_local() -> None:
    """With groups of 4 blocks, each stretch of a group's windows reads 4 blocks."""
    runs = _runs([np.arange(0, 6400)], [6400], 1)
    order = WindowOrder(runs, shuffle=True, seed=1, block_rows=64, total_rows=6400,
                        blocks_per_group=4).epoch(0)
    blocks = order.starts(0, 6400) // 64
    for group in range(25):
        part = blocks[group * 256:(group + 1) * 256]
        assert len(np.unique(part)) == 4
        assert len(np.unique(part[:32])) == 4  # and the group is well mixed
    assert not np.array_equal(np.unique(blocks[:256]), np.arange(4))  # blocks are permuted


def test_epochs_and_seeds_change_the_order_and_reproduce() -> None:
    runs = _runs([np.arange(0, 500, 2), np.arange(0, 300, 2)], [500, 300], 2)

    def epoch(seed: int, number: int) -> np.ndarray:
        return WindowOrder(runs, shuffle=True, seed=seed, block_rows=16, total_rows=800,
                           blocks_per_group=5).epoch(number).starts(0, runs.total)

    assert not np.array_equal(epoch(0, 0), epoch(0, 1))
    assert not np.array_equal(epoch(0, 0), epoch(1, 0))
    np.testing.assert_array_equal(epoch(3, 2), epoch(3, 2))


def test_memory_grows_with_blocks_not_windows() -> None:
    """33M windows in 1k blocks: the epoch order holds a few arrays per block."""
    runs = _runs([np.array([0])], [1], 1)
    runs = WindowRuns(runs.series, runs.first, np.array([33_000_000]), 1, runs.row_offset)
    order = WindowOrder(runs, shuffle=True, seed=0, block_rows=1 << 15,
                        total_rows=33_000_000, blocks_per_group=8).epoch(0)
    held = sum(v.nbytes for v in vars(order).values() if isinstance(v, np.ndarray))
    assert held < 64 * 1024
    batch = order.batch(100_000, 256)
    assert len(np.unique(batch)) == 256 and batch.min() >= 0 and batch.max() < 33_000_000
    with pytest.raises(IndexError):
        order.starts(0, 33_000_001)


def test_invalid_arguments() -> None:
    runs = _runs([np.arange(10)], [10], 1)
    with pytest.raises(InvalidSpecError, match="seed must be an integer >= 0, got -1"):
        WindowOrder(runs, shuffle=True, seed=-1, block_rows=4, total_rows=10,
                    blocks_per_group=1)
    with pytest.raises(InvalidSpecError, match="blocks_per_group must be an integer >= 1"):
        WindowOrder(runs, shuffle=True, seed=0, block_rows=4, total_rows=10,
                    blocks_per_group=0)
