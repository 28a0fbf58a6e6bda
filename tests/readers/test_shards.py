"""Shards at any size, in every reader and mode: a store whose split sits in
one storage block splits into 2 and 4 shards; shares are disjoint, cover the
split and differ by at most one window; every shard yields as many windows,
a short one repeating its last one only; a shard's epoch is the whole split's
order restricted to its own windows, the same in every reader."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import windowkit as wk
from tests.conftest import collect_epoch
from tests.helpers import numbered_series

torch = pytest.importorskip("torch")

SPEC = wk.WindowSpec(6, horizon=1)
MODES = [True, "global", "blocks", False]

#: make test runs a one-block split in every reader on every format, but the tf.data
#: reader on Parquet only in make test-slow: it reads Zarr's and Parquet's groups with one
#: Python function (each format's row reader, read here by Keras and torch too), the
#: same path as on Zarr; TFRecord's are read in the graph (conftest.py: FAST_IDS)
FAST_IDS = {"test_a_one_block_split_shards_in_every_reader_and_mode": {
    f"{fmt}-{shards}-{reader}" for fmt in ("zarr", "parquet", "tfrecord") for shards in (2, 4)
    for reader in ("tf", "keras", "torch") if (fmt, reader) != ("parquet", "tf")}}


def _firsts(x: np.ndarray) -> np.ndarray:
    return np.asarray(x)[:, 0, 0].astype(np.int64)  # numbered rows: a window's first row


def _shard_epoch(store: wk.Store, reader: str, shuffle: bool | str, shards: int, index: int,
                 epoch: int = 0) -> np.ndarray:
    if reader == "tf":
        x, _ = collect_epoch(store.tf_dataset("train", 8, shuffle=shuffle, seed=4,
                                              num_shards=shards, shard_index=index, epoch=epoch))
        return _firsts(x)
    if reader == "keras":
        ds = store.keras_dataset("train", 8, shuffle=shuffle, seed=4, num_shards=shards,
                                 shard_index=index)
        ds.epoch = epoch
        return np.concatenate([_firsts(ds[b][0]) for b in range(len(ds))])
    ds = store.torch_dataset("train", 8, shuffle=shuffle, seed=4, rank=index, world_size=shards)
    ds.set_epoch(epoch)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, sampler=ds.sampler())
    return np.concatenate([_firsts(x.numpy()) for x, _ in loader])


@pytest.fixture
def one_block_store(tmp_path: Path, fmt: str) -> wk.Store:
    """Two short series, 41 windows in all, in a single storage block."""
    store = wk.convert(numbered_series([30, 22], features=1), tmp_path / "s", format=fmt,
                       window=SPEC, splits={"train": 1.0})
    assert np.count_nonzero(store.read_plan("train").windows_per_block()) == 1
    return store


@pytest.mark.parametrize("reader", ["tf", "keras", "torch"])
@pytest.mark.parametrize("shards", [2, 4])
def test_a_one_block_split_shards_in_every_reader_and_mode(one_block_store: wk.Store,
                                                           reader: str, shards: int) -> None:
    store = one_block_store
    total = store.num_windows("train")
    for shuffle in MODES:
        whole = _shard_epoch(store, "keras", shuffle, 1, 0)  # the split's order of epoch 0
        epochs = [_shard_epoch(store, reader, shuffle, shards, i) for i in range(shards)]
        assert len({len(e) for e in epochs}) == 1, shuffle  # every shard steps together
        own = [np.unique(e) for e in epochs]
        assert all(len(e) - len(o) <= 1 for e, o in zip(epochs, own, strict=True))
        assert max(map(len, own)) - min(map(len, own)) <= 1
        together = np.concatenate(own)
        assert len(together) == len(np.unique(together)) == total, shuffle
        for e, o in zip(epochs, own, strict=True):  # the whole order, restricted
            restricted = whole[np.isin(whole, o)]
            np.testing.assert_array_equal(e, np.append(restricted, restricted[-1])
                                          if len(e) > len(o) else restricted)


def test_a_rank_repeats_at_most_one_window_at_scale(tmp_path: Path) -> None:
    """140,000 rows, two ranks, batches of 1,024: no window read more than
    twice an epoch, at most one repeated in all."""
    store = wk.convert(np.arange(280_000, dtype=np.float32).reshape(140_000, 2),
                       tmp_path / "s", format="zarr", window=32)
    counts = np.zeros(store.num_windows("train") + 32, dtype=np.int64)
    for rank in range(2):
        ds = store.torch_dataset("train", 1024, rank=rank, world_size=2)
        for x in torch.utils.data.DataLoader(ds, batch_size=None, sampler=ds.sampler()):
            np.add.at(counts, (x[:, 0, 0].numpy() // 2).astype(np.int64), 1)
    read = counts[counts > 0]
    assert len(read) == store.num_windows("train")
    assert read.max() <= 2 and int((read - 1).sum()) <= 1


@pytest.mark.parametrize("reader", ["keras", "torch"])
def test_a_position_saved_on_4_shards_resumes_on_2(tmp_path: Path, fmt: str,
                                                   reader: str) -> None:
    """Epoch 1 stopped after 3 batches on each of 4 shards, resumed on 2: the
    rest of epoch 1 holds every window not yet read exactly once (a shard one
    short repeats its last), then epoch 2 is whole; another seed is refused."""
    store = wk.convert(numbered_series([300, 170, 9, 140], features=1), tmp_path / "s",
                       format=fmt, window=SPEC, block_rows=32)
    total = store.num_windows("train")
    for shuffle in MODES:
        def make(shards: int, index: int, seed: int = 4, shuffle: bool | str = shuffle) -> Any:
            if reader == "keras":
                return store.keras_dataset("train", 8, shuffle=shuffle, seed=seed,
                                           num_shards=shards, shard_index=index)
            return store.torch_dataset("train", 8, shuffle=shuffle, seed=seed, rank=index,
                                       world_size=shards)

        def batches(ds: Any, epoch: int, count: int | None = None) -> list[np.ndarray]:
            if reader == "keras":
                ds.epoch = epoch
                return [_firsts(ds[b][0]) for b in range(count or len(ds))]
            ds.set_epoch(epoch)
            own = range(ds.rank, len(ds), ds.world_size)
            return [_firsts(ds[j][0].numpy()) for j in list(own)[:count]]

        read = []
        old = [make(4, i) for i in range(4)]
        for ds in old:
            read += batches(ds, 1, 3)
        position = old[0].position_after(3)
        assert position["stops"] == [[4, 24]]
        rest = []
        for index in range(2):
            new = make(2, index)
            new.resume(position)
            rest.append(np.concatenate(batches(new, 1)))
        done, left = np.concatenate(read), [np.unique(r) for r in rest]
        assert len(rest[0]) == len(rest[1]), shuffle
        assert all(len(r) - len(u) <= 1 for r, u in zip(rest, left, strict=True))
        together = np.concatenate([done, *left])
        assert len(together) == len(np.unique(together)) == total, shuffle
        with pytest.raises(wk.InvalidSpecError, match=r"seed=4.*seed=5"):
            make(2, 0, seed=5).resume(position)


def test_tf_epochs_follow_iterators_repeat_set_epoch_and_strategies(tmp_path: Path) -> None:
    """tf.data epochs are numbered as in every reader: each iterator the next
    epoch, ``repeat`` the following ones, ``set_epoch`` sets them, also for a
    distribution strategy's iterators, and Keras ``fit`` follows its epochs."""
    import keras
    import tensorflow as tf

    store = wk.convert(numbered_series([400, 150], features=1), tmp_path / "s",
                       format="parquet", window=SPEC, block_rows=64)
    ref = store.keras_dataset("train", 16, seed=2)

    def keras_epoch(epoch: int) -> np.ndarray:
        ref.epoch = epoch
        return np.concatenate([_firsts(ref[b][0]) for b in range(len(ref))])

    ds = store.tf_dataset("train", 16, seed=2, epoch=3)
    for epoch in (3, 4):
        np.testing.assert_array_equal(_firsts(collect_epoch(ds)[0]), keras_epoch(epoch))
    both = np.concatenate([_firsts(x) for x, _ in ds.repeat(2)])
    np.testing.assert_array_equal(both, np.concatenate([keras_epoch(5), keras_epoch(6)]))
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        x, _ = next(iter(strategy.experimental_distribute_dataset(ds)))
        np.testing.assert_array_equal(_firsts(x), keras_epoch(epoch)[:16])
    seen = []

    class Spy(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
            seen.append(int(ds.epoch_counter.current().numpy()))

    with strategy.scope():
        model = keras.Sequential([keras.Input((6, 1)), keras.layers.Flatten(),
                                  keras.layers.Dense(1)])
        model.compile("sgd", "mse")
    model.fit(ds, epochs=3, initial_epoch=1, verbose=0, callbacks=[ds.epoch_callback(), Spy()])
    assert sorted(set(seen)) == [1, 2]
