"""The sampler: one epoch order, over the blocks holding windows of the split."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import windowkit as wk
from windowkit.readers.epoch.sampler import Sampler


@given(counts=st.lists(st.integers(0, 5), min_size=1, max_size=60),
       group=st.integers(1, 9), seed=st.integers(0, 2**40), epoch=st.integers(0, 50),
       shuffle=st.booleans())
def test_each_epoch_visits_every_block_with_windows_once(counts: list[int], group: int,
                                                         seed: int, epoch: int,
                                                         shuffle: bool) -> None:
    sampler = Sampler(np.array(counts), group=group, shuffle=shuffle, seed=seed)
    groups = list(sampler.groups(epoch))
    visited = np.concatenate([blocks for blocks, _ in groups]) if groups else np.empty(0)
    assert sorted(visited.tolist()) == [b for b, n in enumerate(counts) if n > 0]
    assert all(1 <= len(blocks) <= group for blocks, _ in groups)
    assert all((np.diff(blocks) > 0).all() for blocks, _ in groups)  # read in order
    again = list(Sampler(np.array(counts), group=group, shuffle=shuffle, seed=seed)
                 .groups(epoch))
    assert [b.tolist() for b, _ in groups] == [b.tolist() for b, _ in again]
    if not shuffle:
        assert visited.tolist() == sorted(visited.tolist())


def test_epochs_and_seeds_change_the_block_order() -> None:
    sampler = Sampler(np.ones(200), group=4, shuffle=True, seed=3)
    orders = {tuple(sampler.block_order(e).tolist()) for e in range(5)}
    assert len(orders) == 5
    other = Sampler(np.ones(200), group=4, shuffle=True, seed=4)
    assert not np.array_equal(other.block_order(0), sampler.block_order(0))


# per format: which blocks a split's Keras batches draw from depends on how each
# format's reader groups and caches blocks (the formats this test always ran on)
@pytest.mark.parametrize("fmt", ["zarr", "parquet"])
def test_a_small_split_mixes_its_own_blocks(tmp_path: Path, fmt: str) -> None:
    """Keras batches of a 10% split draw from several of the split's blocks, not
    from groups of the store's blocks that mostly hold none of its windows."""
    block_rows, rows = 128, 2000
    series = [np.arange(k * rows, (k + 1) * rows, dtype=np.float64)[:, None] for k in range(8)]
    store = wk.convert(series, tmp_path / "s", format=fmt, window=wk.WindowSpec(4),
                       block_rows=block_rows, splits={"train": 0.9, "val": 0.1})
    # a block cache of 24 blocks: groups of 4 (a sixth of it, as in every reader),
    # fewer than the ~20 blocks holding val windows
    ds = store.keras_dataset("val", 64, seed=1, cache_bytes=24 * (block_rows + 3) * 8)
    starts = [ds[i][:, 0, 0].astype(np.int64) for i in range(len(ds))]  # global rows
    assert sorted(np.concatenate(starts).tolist()) == sorted(
        store.runs("val").global_starts(np.arange(store.num_windows("val"))).tolist())
    blocks_per_batch = [len(np.unique(s // block_rows)) for s in starts[:-1]]
    assert np.mean(blocks_per_batch) >= 3.0, blocks_per_batch


@given(counts=st.lists(st.integers(0, 5), min_size=1, max_size=80),
       group=st.integers(1, 9), key=st.integers(0, 2**64 - 1), shuffle=st.booleans())
def test_the_graph_sampler_equals_the_numpy_sampler(counts: list[int], group: int, key: int,
                                                    shuffle: bool) -> None:
    """The tf.data readers order an epoch in the graph: the same groups, in the
    same order, with the same keys, as the NumPy sampler for the same epoch key."""
    import tensorflow as tf

    sampler = Sampler(np.array(counts), group=group, shuffle=shuffle, seed=0)
    expected = list(sampler.groups(0, key=np.uint64(key)))
    blocks, keys = (t.numpy() for t in sampler.tf_epoch(tf.constant(key, tf.uint64)))
    assert blocks.tolist() == [b for group, _ in expected for b in group.tolist()]
    assert keys.view(np.uint64).tolist() == [int(k) for group, k in expected
                                             for _ in range(len(group))]


