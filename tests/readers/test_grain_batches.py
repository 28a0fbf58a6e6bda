"""``Store.grain_batches``: a Grain random-access source of whole batches.

Item ``i`` is the Keras reader's batch of the same epoch, window for window
(every window of the split once an epoch, per format and shuffle); the source
holds ``epochs`` epochs one after another, each in its own order; it reads the
same under ``MapDataset``, ``mp_prefetch`` and Grain's ``DataLoader`` with
worker processes; Grain's iterator checkpoints resume exactly, and refuse a
source built otherwise; shards are disjoint and cover the split.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

grain = pytest.importorskip("grain")

import windowkit as wk  # noqa: E402
from tests.conftest import assert_windows_equal, oracle_windows, window_keys  # noqa: E402
from tests.helpers import numbered_series  # noqa: E402

LENGTHS = [500, 320, 7, 260]  # one series too short for a window
SPEC = wk.WindowSpec(5, stride=2, horizon=2)
B = 32


@pytest.fixture
def series() -> list[np.ndarray]:
    return numbered_series(LENGTHS, features=3)


def _convert(series: list[np.ndarray], path: Path, fmt: str = "zarr") -> wk.Store:
    return wk.convert(series, path / fmt, format=fmt, window=SPEC, block_rows=64)


@pytest.fixture
def store(tmp_path: Path, series: list[np.ndarray]) -> wk.Store:
    return _convert(series, tmp_path)


@pytest.fixture(autouse=True, scope="module")
def _absl_flags() -> None:
    """Grain's worker processes read absl flags (outside ``absl.app.run``)."""
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


def _epoch(batches: Any) -> tuple[np.ndarray, np.ndarray]:
    pairs = list(batches)
    return np.concatenate([p[0] for p in pairs]), np.concatenate([p[1] for p in pairs])


def _assert_same(got: list[Any], want: list[Any]) -> None:
    assert len(got) == len(want)
    for (gx, gy), (wx, wy) in zip(got, want, strict=True):
        assert isinstance(gx, np.ndarray) and isinstance(gy, np.ndarray)
        np.testing.assert_array_equal(gx, wx)
        np.testing.assert_array_equal(gy, wy)


@pytest.mark.parametrize("shuffle", [True, "blocks", False])
def test_items_are_the_keras_batches_of_each_epoch(tmp_path: Path, fmt: str, shuffle: bool | str,
                                                   series: list[np.ndarray]) -> None:
    store = _convert(series, tmp_path, fmt)
    src = store.grain_batches("train", B, shuffle=shuffle, seed=3, epochs=2)
    keras_ds = store.keras_dataset("train", B, shuffle=shuffle, seed=3)
    per = src.batches_per_epoch
    want_x, want_y = oracle_windows(series, SPEC)
    assert per == len(keras_ds) == -(-len(want_x) // B) and len(src) == 2 * per
    epochs = []
    for epoch in (0, 1):
        keras_ds.epoch = epoch
        items = [src[epoch * per + i] for i in range(per)]
        _assert_same(items, [keras_ds[i] for i in range(per)])
        x, y = _epoch(items)
        assert_windows_equal(x, y, want_x, want_y, in_order=shuffle is False)
        epochs.append(x)
    assert np.array_equal(epochs[0], epochs[1]) == (shuffle is False)
    later = store.grain_batches("train", B, shuffle=shuffle, seed=3, epoch=1)
    _assert_same([later[i] for i in range(len(later))], [src[per + i] for i in range(per)])


def test_fields_normalized_and_the_last_batch_dropped(store: wk.Store) -> None:
    src = store.grain_batches("train", B, seed=1, normalize=True, return_series=True,
                              drop_remainder=True)
    keras_ds = store.keras_dataset("train", B, seed=1, normalize=True, return_series=True,
                                   drop_remainder=True)
    assert len(src) == len(keras_ds) == store.num_windows("train") // B
    (x, y), (kx, ky) = src[-1], keras_ds[len(keras_ds) - 1]
    assert set(x) == set(kx) == {"inputs", "series"} and len(y) == B
    for key in x:
        np.testing.assert_array_equal(x[key], kx[key])
    np.testing.assert_array_equal(y, ky)


def test_map_dataset_and_worker_processes_read_the_items_in_order(store: wk.Store) -> None:
    src = store.grain_batches("train", B, seed=2, epochs=2)
    want = [src[i] for i in range(len(src))]
    ds = grain.MapDataset.source(src)
    _assert_same(list(ds), want)
    _assert_same(list(ds.to_iter_dataset()), want)
    read = grain.ReadOptions(num_threads=1, prefetch_buffer_size=4)  # what the docs advise
    _assert_same(list(ds.to_iter_dataset(read)), want)
    options = grain.multiprocessing.MultiprocessingOptions(num_workers=2)
    _assert_same(list(ds.to_iter_dataset().mp_prefetch(options)), want)


def _loader(src: Any, workers: int = 0, num_epochs: int = 1, records: int | None = None) -> Any:
    sampler = grain.samplers.IndexSampler(records or len(src),
                                          shard_options=grain.sharding.NoSharding(),
                                          shuffle=False, num_epochs=num_epochs, seed=0)
    return grain.DataLoader(data_source=src, sampler=sampler, worker_count=workers)


def test_data_loader_with_workers_reads_each_epoch_in_its_order(store: wk.Store) -> None:
    src = store.grain_batches("train", B, seed=4, epochs=2)
    want = [src[i] for i in range(len(src))]
    _assert_same(list(_loader(src, workers=2)), want)
    one = store.grain_batches("train", B, seed=4)  # Grain's own epochs replay the source's
    _assert_same(list(_loader(one, num_epochs=2)), want[:len(one)] * 2)


def test_grain_checkpoints_resume_with_exactly_the_rest(store: wk.Store) -> None:
    src = store.grain_batches("train", B, seed=5, epochs=2)
    want = [src[i] for i in range(len(src))]
    k = len(want) // 2 + 3  # into the second epoch
    loader = iter(_loader(src))
    for _ in range(k):
        next(loader)
    saved = loader.get_state()
    again = iter(_loader(pickle.loads(pickle.dumps(src))))
    again.set_state(saved)
    _assert_same(list(again), want[k:])

    it = iter(grain.MapDataset.source(src).to_iter_dataset())
    for _ in range(k):
        next(it)
    state = it.get_state()
    resumed = iter(grain.MapDataset.source(store.grain_batches("train", B, seed=5, epochs=2))
                   .to_iter_dataset())
    resumed.set_state(state)
    _assert_same(list(resumed), want[k:])


def test_a_checkpoint_is_refused_by_a_source_built_otherwise(store: wk.Store) -> None:
    src = store.grain_batches("train", B, seed=5)
    loader = iter(_loader(src))
    next(loader)
    saved = loader.get_state()
    for other in (store.grain_batches("train", B, seed=6), store.grain_batches("train", B + 1),
                  store.grain_batches("train", B, seed=5, shuffle=False),
                  store.grain_batches("train", B, seed=5, num_shards=2, shard_index=0)):
        again = iter(_loader(other, records=len(src)))  # the same sampler: only the source
        with pytest.raises(ValueError, match="data source"):
            again.set_state(saved)
    text = repr(src)
    for part in (store.manifest.store_id[:12], "split='train'", f"batch_size={B}", "seed=5",
                 "shuffle=True", "shard=0", "num_shards=1"):
        assert part in text, part


def test_pickles_small_and_reads_the_same(store: wk.Store) -> None:
    src = store.grain_batches("train", B, seed=7)
    src[0]  # rows held in this process: not pickled
    copy = pickle.loads(pickle.dumps(src))
    assert len(pickle.dumps(src)) < 20_000 and repr(copy) == repr(src)
    _assert_same([copy[i] for i in range(len(copy))], [src[i] for i in range(len(src))])


@pytest.mark.parametrize("shuffle", [True, False])
def test_two_shards_are_disjoint_and_cover_the_split(store: wk.Store, series: list[np.ndarray],
                                                     shuffle: bool) -> None:
    shards = [store.grain_batches("train", B, shuffle=shuffle, seed=8, num_shards=2,
                                  shard_index=k) for k in (0, 1)]
    assert len(shards[0]) == len(shards[1])
    keys = []
    for k, src in enumerate(shards):
        keras_ds = store.keras_dataset("train", B, shuffle=shuffle, seed=8, num_shards=2,
                                       shard_index=k)
        items = [src[i] for i in range(len(src))]
        _assert_same(items, [keras_ds[i] for i in range(len(keras_ds))])
        keys.append(set(window_keys(*_epoch(items))))
    want = set(window_keys(*oracle_windows(series, SPEC)))
    assert not keys[0] & keys[1] and keys[0] | keys[1] == want


def test_bad_indices_are_one_line(store: wk.Store) -> None:
    src = store.grain_batches("train", B, epochs=2)
    n = len(src)
    np.testing.assert_array_equal(src[np.int64(n - 1)][0], src[-1][0])  # type: ignore[index]
    for bad, error, text in [(n, IndexError, f"batch {n} is out of range for {n} batches"),
                             (-n - 1, IndexError, f"batch {-n - 1} is out of range"),
                             (1.0, TypeError, "batch indices are integers, got 1.0 (float)"),
                             (True, TypeError, "batch indices are integers, got True"),
                             ("1", TypeError, "batch indices are integers, got '1'")]:
        with pytest.raises(error) as caught:
            src[bad]  # type: ignore[index]
        assert str(caught.value).startswith(text) and "\n" not in str(caught.value)
    for name, value in [("epochs", 0), ("epoch", -1), ("batch_size", 0), ("shuffle", "yes")]:
        options: dict[str, Any] = {"batch_size": B, name: value}
        with pytest.raises(wk.InvalidSpecError) as caught:
            store.grain_batches("train", **options)
        assert name in str(caught.value) and "\n" not in str(caught.value)
