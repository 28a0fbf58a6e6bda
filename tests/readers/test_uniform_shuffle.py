"""Uniform shuffling at any size: in memory, spilled beyond the memory budget,
the default ``shuffle=True``, dealt shards; both readers, every format,
against the NumPy oracle."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import windowkit as wk
from tests.conftest import assert_windows_equal, collect_epoch, oracle_windows
from windowkit.errors import InvalidSpecError
from windowkit.index import WindowRuns
from windowkit.readers import BatchOptions, ReadPlan, ShuffleOptions
from windowkit.readers.epoch.batches import EpochBatches
from windowkit.readers.epoch.choice import choose_shuffle
from windowkit.readers.epoch.shares import ShardSequence, ShardShare
from windowkit.readers.options import BUDGET_CAP, BUDGET_FLOOR, default_memory_budget
from windowkit.readers.rows.held import UniformOrder

SPEC = wk.WindowSpec(length=6, horizon=2, stride=2)
TINY = 4096  # bytes: far below any test store's rows, so they are spilled


def _numbered(lengths: list[int], features: int = 3) -> list[np.ndarray]:
    """Series whose rows are unique: column 0 is the global row number."""
    out, first = [], 0
    for n in lengths:
        rows = np.random.default_rng(n).standard_normal((n, features)).astype(np.float32)
        rows[:, 0] = np.arange(first, first + n)
        out.append(rows)
        first += n
    return out


@pytest.fixture
def numbered_store(fmt: str, tmp_path: Path) -> tuple[wk.Store, list[np.ndarray]]:
    series = _numbered([700, 530, 910, 410])
    return wk.convert(series, tmp_path / "s", format=fmt, window=SPEC, block_rows=64), series


def _keras_epoch(ds: wk.readers.keras_pydataset.WindowPyDataset) -> tuple[np.ndarray, np.ndarray]:
    batches = [ds[i] for i in range(len(ds))]
    return np.concatenate([b[0] for b in batches]), np.concatenate([b[1] for b in batches])


@pytest.mark.parametrize("budget", [None, TINY], ids=["in-memory", "spilled"])
def test_every_window_exactly_once_each_epoch(numbered_store: tuple[wk.Store, list[np.ndarray]],
                                              budget: int | None) -> None:
    """Both readers: each epoch holds the oracle's windows exactly once, in a new order."""
    store, series = numbered_store
    expected_x, expected_y = oracle_windows(series, SPEC)
    ds = store.tf_dataset("train", 37, shuffle="global", seed=3, memory_budget=budget)
    first, second = collect_epoch(ds), collect_epoch(ds)
    for x, y in (first, second):
        assert_windows_equal(x, y, expected_x, expected_y, in_order=False)
    assert not np.array_equal(first[0], second[0])  # a new permutation each iteration
    keras_ds = store.keras_dataset("train", 37, shuffle="global", seed=3, memory_budget=budget)
    x, y = _keras_epoch(keras_ds)
    assert_windows_equal(x, y, expected_x, expected_y, in_order=False)
    keras_ds.on_epoch_end()
    assert not np.array_equal(x, _keras_epoch(keras_ds)[0])


def _uniform(plan: ReadPlan, batch_size: int, seed: int, budget: int) -> EpochBatches:
    """Normalized dict batches of a uniform shuffle, the rows held within ``budget``."""
    return EpochBatches(plan, BatchOptions(batch_size, normalize=True, return_series=True),
                        ShuffleOptions("global", seed=seed, memory_budget=budget))


def test_spilled_equals_in_memory(numbered_store: tuple[wk.Store, list[np.ndarray]]) -> None:
    """The same seed gives the same batches whether the rows are held in memory
    or spilled; the Keras reader gives the same batches as tf.data's first epoch
    when both use the same permutation key."""
    store, _ = numbered_store
    plan = store.read_plan("train")
    held, spilled = (_uniform(plan, 50, 1, budget) for budget in (1 << 30, TINY))
    assert not held.held_rows().spilled and spilled.held_rows().spilled
    for index in (0, 3, -(-plan.num_windows // 50) - 1):
        a, b = held.batch_at(99, index), spilled.batch_at(99, index)
        np.testing.assert_array_equal(a[1], b[1])
        for key in ("inputs", "series"):
            np.testing.assert_array_equal(a[0][key], b[0][key])


def test_spill_is_private_and_checked(numbered_store: tuple[wk.Store, list[np.ndarray]],
                                      tmp_path: Path) -> None:
    """A spill leaves no file a path reaches; a missing spill_dir is one line."""
    store, _ = numbered_store
    spill = tmp_path / "spill"
    spill.mkdir()
    ds = store.tf_dataset("train", 64, shuffle="global", memory_budget=TINY, spill_dir=spill)
    next(iter(ds))
    assert os.listdir(spill) == []
    with pytest.raises(InvalidSpecError, match=r"spill_dir .* is not a directory"):
        store.tf_dataset("train", 64, shuffle="global", memory_budget=TINY,
                         spill_dir=tmp_path / "missing")


def test_normalized_dict_batches_match_random_access(
        numbered_store: tuple[wk.Store, list[np.ndarray]]) -> None:
    """Spilled, normalized dict batches equal Store.windows at the same windows."""
    store, _ = numbered_store
    plan = store.read_plan("train")
    source = _uniform(plan, 40, 5, TINY)
    order = UniformOrder(plan.runs, seed=5)
    starts = plan.runs.global_starts(order.full(1, np.arange(40, 80)))  # batch 1 of epoch 1
    every = plan.runs.global_starts(np.arange(plan.num_windows))  # ascending
    positions = np.searchsorted(every, starts)
    expected_x, expected_y = store.windows("train", positions, normalize=True,
                                           return_series=True)
    got_x, got_y = source.batch_at(1, 1)
    assert set(got_x) == {"inputs", "series"}
    np.testing.assert_allclose(got_x["inputs"], expected_x["inputs"], rtol=1e-6)
    np.testing.assert_array_equal(got_x["series"], expected_x["series"])
    np.testing.assert_allclose(got_y, expected_y, rtol=1e-6)


def test_default_mixes_every_series(fmt: str, tmp_path: Path) -> None:
    """The default shuffle=True on a split that fits the budget is uniform: a
    batch of 256 holds (nearly) every one of 20 series."""
    series = _numbered([1000] * 20, features=2)
    store = wk.convert(series, tmp_path / "s", format=fmt, window=16, block_rows=128)
    assert choose_shuffle(store.read_plan("train"), True).mode == "uniform"
    counts = []
    for batch in store.tf_dataset("train", 256, seed=0, drop_remainder=True):
        rows = batch.numpy()[:, 0, 0].astype(np.int64)
        counts.append(len(np.unique(rows // 1000)))
    assert np.mean(counts) >= 18


def test_true_beyond_budget_is_block_groups(numbered_store: tuple[wk.Store, list[np.ndarray]]
                                            ) -> None:
    """shuffle=True with a split larger than the budget reads block groups (still
    every window once); shuffle='blocks' asks for them at any size."""
    store, series = numbered_store
    plan = store.read_plan("train")
    assert choose_shuffle(plan, True, memory_budget=TINY).mode == "blocks"
    assert choose_shuffle(plan, "blocks").mode == "blocks"
    assert choose_shuffle(plan, False).mode == "ordered"
    expected_x, expected_y = oracle_windows(series, SPEC)
    x, y = collect_epoch(store.tf_dataset("train", 50, memory_budget=TINY))
    assert_windows_equal(x, y, expected_x, expected_y, in_order=False)


@pytest.mark.parametrize("reader", ["tf", "keras"])
def test_uniform_shards_own_contiguous_pieces(
        numbered_store: tuple[wk.Store, list[np.ndarray]], reader: str) -> None:
    """Three shards of a uniform shuffle: disjoint, together every window, within
    one window of each other in size, each its own contiguous piece of the
    split's index (so each holds only its own rows), in the whole split's order
    restricted to that piece."""
    store, series = numbered_store
    expected_x, expected_y = oracle_windows(series, SPEC)
    xs, ys, firsts = [], [], []
    for index in range(3):
        if reader == "tf":
            x, y = collect_epoch(store.tf_dataset("train", 32, shuffle="global",
                                                  memory_budget=TINY, seed=2, num_shards=3,
                                                  shard_index=index))
        else:
            x, y = _keras_epoch(store.keras_dataset("train", 32, shuffle="global", seed=2,
                                                    num_shards=3, shard_index=index))
        xs.append(x)
        ys.append(y)
        firsts.append(x[:, 0, 0])
    assert max(map(len, xs)) == min(map(len, xs))  # padded to the same length
    whole = collect_epoch(store.tf_dataset("train", 32, shuffle="global", memory_budget=TINY,
                                           seed=2))[0][:, 0, 0]
    own = []
    for first in firsts:
        mine = np.unique(first)
        assert len(first) - len(mine) <= 1  # at most one window repeated
        own.append(mine)
        # the whole split's order, restricted to this shard's windows
        np.testing.assert_array_equal(whole[np.isin(whole, mine)], first[:len(mine)])
    assert sum(map(len, own)) == len(whole)
    assert max(map(len, own)) - min(map(len, own)) <= 1
    assert_windows_equal(np.concatenate([x[:len(m)] for x, m in zip(xs, own, strict=True)]),
                         np.concatenate([y[:len(m)] for y, m in zip(ys, own, strict=True)]),
                         expected_x, expected_y, in_order=False)


def test_keras_resumes_mid_epoch_in_uniform_mode(
        numbered_store: tuple[wk.Store, list[np.ndarray]]) -> None:
    store, _ = numbered_store
    ds = store.keras_dataset("train", 30, shuffle="global", memory_budget=TINY, seed=4)
    ds.seek(2)
    whole = [ds[i][0] for i in range(len(ds))]
    ds.seek(2, 5)
    rest = [ds[i][0] for i in range(len(ds))]
    assert len(rest) == len(whole) - 5
    for a, b in zip(whole[5:], rest, strict=True):
        np.testing.assert_array_equal(a, b)


@settings(max_examples=40, deadline=None)
@given(total=st.integers(1, 3000), shards=st.integers(1, 7), seed=st.integers(0, 2**31),
       epoch=st.integers(0, 5))
def test_shard_orders_are_the_split_order_restricted(total: int, shards: int, seed: int,
                                                     epoch: int) -> None:
    """The shards' epochs together are every window exactly once, each the whole
    split's order restricted to the shard's own contiguous piece."""
    shards = min(shards, total)
    runs = WindowRuns(series=np.array([0, 1], dtype=np.int32),
                      first=np.array([0, 1], dtype=np.int64),
                      count=np.array([total // 2, total - total // 2], dtype=np.int64),
                      stride=3, row_offset=np.array([0, 10 * total], dtype=np.int64))
    order = UniformOrder(runs, seed=seed)
    whole = order.full(epoch, np.arange(total))
    seen = []
    for index in range(shards):
        share = ShardShare(index, shards, total)
        mine = ShardSequence(share, order.full, ordered=False).positions(
            epoch, np.arange(share.windows_per_epoch()))
        restricted = whole[(whole >= share.lo) & (whole < share.hi)]
        np.testing.assert_array_equal(mine[:share.size], restricted)
        assert len(mine) == -(-total // shards) and set(mine[share.size:]) <= {restricted[-1]}
        seen.append(restricted)
    np.testing.assert_array_equal(np.sort(np.concatenate(seen)), np.arange(total))


def test_default_budget_is_bounded() -> None:
    assert BUDGET_FLOOR <= default_memory_budget() <= BUDGET_CAP


@pytest.mark.parametrize("reader", ["tf_dataset", "keras_dataset"])
def test_reader_flags_must_be_bools(numbered_store: tuple[wk.Store, list[np.ndarray]],
                                    reader: str) -> None:
    store, _ = numbered_store
    with pytest.raises(InvalidSpecError, match="normalize must be True or False, got 'zscore'"):
        getattr(store, reader)("train", 32, normalize="zscore")


@pytest.mark.parametrize("fmt", ["zarr"])
@pytest.mark.parametrize("chunk_bytes", [1, 3 * 37 * 8 * 3 * 4 + 5], ids=["one batch", "three"])
def test_large_batches_are_cut_fewer_at_a_time(numbered_store: tuple[wk.Store, list[np.ndarray]],
                                               chunk_bytes: int,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches whose chunk of 16 would pass ``CHUNK_BYTES`` are cut a few at a
    time: the same batches, in the same order, with a shorter last chunk."""
    from windowkit.readers.tfdata import uniform

    store, _ = numbered_store
    want = list(store.tf_dataset("train", 37, shuffle="global", seed=5))
    monkeypatch.setattr(uniform, "CHUNK_BYTES", chunk_bytes)
    assert uniform.chunk_batches(37 * SPEC.steps * 3 * 4) == (1 if chunk_bytes == 1 else 3)
    got = list(store.tf_dataset("train", 37, shuffle="global", seed=5))
    assert len(got) == len(want) and len(want) % 3 != 0  # a last chunk of fewer batches
    for (x1, y1), (x2, y2) in zip(got, want, strict=True):
        np.testing.assert_array_equal(x1.numpy(), x2.numpy())
        np.testing.assert_array_equal(y1.numpy(), y2.numpy())
