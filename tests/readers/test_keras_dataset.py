"""``Store.keras_dataset``: a ``keras.utils.PyDataset`` of whole batches, per format.

An epoch (batches ``0 .. len-1``) must hold exactly the NumPy oracle's windows,
each once, also when Keras' own machinery fetches batches with worker threads
or processes.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar

import keras
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from keras.src.trainers.data_adapters.py_dataset_adapter import PyDatasetAdapter

import windowkit as wk
from tests.conftest import assert_windows_equal, oracle_windows, window_keys
from tests.helpers import datasets, numbered_series
from windowkit.readers import BatchOptions, ShuffleOptions
from windowkit.readers.keras_pydataset import WindowPyDataset

Epoch = tuple[np.ndarray, np.ndarray | None]
LENGTHS = [500, 320, 7, 260]  # one series too short for a window
SPEC = wk.WindowSpec(5, stride=2, horizon=2)


def _epoch(ds: WindowPyDataset) -> Epoch:
    """Batches ``0 .. len-1`` concatenated (without ending the epoch)."""
    return _concat([ds[i] for i in range(len(ds))])


def _concat(batches: list[Any]) -> Epoch:
    """``x`` and ``y`` of batches that are ``x``, ``(x,)`` or ``(x, y)``."""
    if not batches:
        return np.empty((0,)), None
    parts = [b if isinstance(b, tuple) else (b,) for b in batches]
    x = np.concatenate([p[0] for p in parts])
    return x, (np.concatenate([p[1] for p in parts]) if len(parts[0]) > 1 else None)


def _is_sub_multiset(keys: list[bytes], of: list[bytes]) -> bool:
    return not Counter(keys) - Counter(of)


def _keras_epoch(adapter: PyDatasetAdapter) -> list[Any]:
    """One epoch through Keras' adapter (its enqueuer runs the workers)."""
    adapter.on_epoch_begin()
    batches = list(adapter.get_numpy_iterator())
    adapter.on_epoch_end()
    return batches


def _no_children_left(timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while multiprocessing.active_children():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture
def store(fmt: str, tmp_path: Path) -> wk.Store:
    """Numbered series with a horizon, in small blocks."""
    return wk.convert(numbered_series(LENGTHS), tmp_path / "s", format=fmt, window=SPEC,
                      block_rows=16)


def _oracle() -> Epoch:
    return oracle_windows(numbered_series(LENGTHS), SPEC)


def test_is_a_pydataset_of_whole_batches(store: wk.Store) -> None:
    ds = store.keras_dataset("train", 32, cache_bytes=1 << 12)
    assert isinstance(ds, keras.utils.PyDataset) and isinstance(ds, WindowPyDataset)
    total = store.num_windows("train")
    assert ds.num_windows == total and len(ds) == -(-total // 32) == ds.num_batches
    assert (ds.workers, ds.use_multiprocessing, ds.max_queue_size) == (1, False, 10)
    x, y = ds[0]
    assert x.shape == (32, 5, 2) and y.shape == (32, 2, 2)
    assert x.dtype == y.dtype == np.float64
    last = ds[len(ds) - 1]
    assert len(last[0]) == total - 32 * (len(ds) - 1)
    np.testing.assert_array_equal(ds[-1][0], last[0])
    for bad in (len(ds), -len(ds) - 1):
        with pytest.raises(IndexError, match=f"batch {bad} is out of range for {len(ds)}"):
            ds[bad]
    with pytest.raises(TypeError):
        ds[1.0]


def test_epoch_equals_oracle(store: wk.Store) -> None:
    expected_x, expected_y = _oracle()
    x, y = _epoch(store.keras_dataset("train", 32, shuffle=False))
    np.testing.assert_array_equal(x, expected_x)
    np.testing.assert_array_equal(y, expected_y)
    x, y = _epoch(store.keras_dataset("train", 32, shuffle=True, cache_bytes=1 << 12))
    assert sorted(window_keys(x, y)) == sorted(window_keys(expected_x, expected_y))
    assert not np.array_equal(x, expected_x)


def test_without_horizon_batches_are_arrays(fmt: str, tmp_path: Path) -> None:
    series = numbered_series([90, 40])
    store = wk.convert(series, tmp_path / "s", format=fmt, window=6)
    ds = store.keras_dataset("train", 16, shuffle=False)
    assert isinstance(ds[0], np.ndarray) and ds[0].shape == (16, 6, 2)
    x, _ = _epoch(ds)
    np.testing.assert_array_equal(x, oracle_windows(series, wk.WindowSpec(6))[0])


@settings(max_examples=10)
@given(data=datasets(), batch_size=st.integers(1, 40), shuffle=st.booleans(),
       drop_remainder=st.booleans(), cache_bytes=st.sampled_from([1, 1 << 12, 1 << 20]))
def test_roundtrip_matches_oracle(fmt: str, data: tuple, batch_size: int, shuffle: bool,
                                  drop_remainder: bool, cache_bytes: int) -> None:
    series, spec, block_rows = data
    expected_x, expected_y = oracle_windows(series, spec)
    with tempfile.TemporaryDirectory() as tmp:
        store = wk.convert(series, Path(tmp) / "store", format=fmt, window=spec,
                           block_rows=block_rows)
        ds = store.keras_dataset("train", batch_size, shuffle=shuffle, seed=5,
                                 drop_remainder=drop_remainder, cache_bytes=cache_bytes)
        total = len(expected_x)
        assert len(ds) == (total // batch_size if drop_remainder else -(-total // batch_size))
        x, y = _epoch(ds)
    if len(ds) == 0:
        return
    assert x.dtype == series[0].dtype and x.shape[1:] == expected_x.shape[1:]
    assert (y is not None) == (spec.horizon > 0)
    if drop_remainder:
        assert len(x) == len(ds) * batch_size
        assert _is_sub_multiset(window_keys(x, y), window_keys(expected_x, expected_y))
    else:
        assert_windows_equal(x, y, expected_x, expected_y, in_order=not shuffle)


def test_epochs_come_in_new_seeded_orders(store: wk.Store) -> None:
    ds = store.keras_dataset("train", 32, seed=11, cache_bytes=1 << 12)
    first = _epoch(ds)[0][:, 0, 0]
    ds.on_epoch_end()
    assert ds.epoch == 1
    second = _epoch(ds)[0][:, 0, 0]
    assert sorted(first.tolist()) == sorted(second.tolist())
    assert not np.array_equal(first, second), "second epoch came in the same order"
    again = store.keras_dataset("train", 32, seed=11, cache_bytes=1 << 12)
    np.testing.assert_array_equal(_epoch(again)[0][:, 0, 0], first)
    again.on_epoch_end()
    np.testing.assert_array_equal(_epoch(again)[0][:, 0, 0], second)
    other = store.keras_dataset("train", 32, seed=12, cache_bytes=1 << 12)
    assert not np.array_equal(_epoch(other)[0][:, 0, 0], first)


def test_batches_are_random_access_from_threads(store: wk.Store) -> None:
    ds = store.keras_dataset("train", 8, seed=2, cache_bytes=1 << 12)
    in_order = [ds[i] for i in range(len(ds))]
    shuffled = np.random.default_rng(0).permutation(len(ds)).tolist()
    fresh = store.keras_dataset("train", 8, seed=2, cache_bytes=1 << 12)
    with ThreadPoolExecutor(4) as pool:
        got = dict(zip(shuffled, pool.map(fresh.__getitem__, shuffled), strict=True))
    for i, (x, y) in enumerate(in_order):
        np.testing.assert_array_equal(got[i][0], x)
        np.testing.assert_array_equal(got[i][1], y)


def test_drop_remainder(store: wk.Store) -> None:
    total = store.num_windows("train")
    ds = store.keras_dataset("train", 64, drop_remainder=True)
    assert len(ds) == total // 64
    x, y = _epoch(ds)
    assert len(x) == len(ds) * 64 and all(len(ds[i][0]) == 64 for i in range(len(ds)))
    assert _is_sub_multiset(window_keys(x, y), window_keys(*_oracle()))


def test_normalize(fmt: str, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    values = rng.normal([10.0, -3.0], [2.0, 0.5], size=(600, 2)).astype(np.float16)
    store = wk.convert([values], tmp_path / "s", format=fmt, window=wk.WindowSpec(8, horizon=1))
    ds = store.keras_dataset("train", 50, shuffle=False, normalize=True)
    x, y = ds[1]
    assert x.dtype == y.dtype == np.float32
    want_x, want_y = store.windows("train", np.arange(50, 100), normalize=True)
    np.testing.assert_array_equal(x, want_x)
    np.testing.assert_array_equal(y, want_y)
    x, _ = _epoch(ds)
    assert abs(float(x.mean())) < 0.1 and abs(float(x.std()) - 1) < 0.1


def test_invalid_arguments(store: wk.Store) -> None:
    with pytest.raises(wk.InvalidSpecError, match="batch_size must be an integer >= 1, got 0"):
        store.keras_dataset("train", 0)
    with pytest.raises(wk.InvalidSpecError, match="seed must be an integer >= 0, got -1"):
        store.keras_dataset("train", seed=-1)
    with pytest.raises(wk.InvalidSpecError, match="workers must be an integer >= 0"):
        store.keras_dataset("train", workers=-1)
    with pytest.raises(wk.InvalidSpecError, match="split 'val' is not in store"):
        store.keras_dataset("val")


def test_pickles_by_path_after_use(store: wk.Store) -> None:
    ds = store.keras_dataset("train", 32, seed=4, cache_bytes=1 << 12, workers=3)
    before = ds[2]  # the dataset now holds a block cache, which must not travel
    ds.on_epoch_end()
    blob = pickle.dumps(ds)
    assert len(blob) < 16 * 1024
    clone = pickle.loads(blob)
    assert clone.epoch == 1 and clone.workers == 3 and len(clone) == len(ds)
    for i in (0, 2, len(ds) - 1):
        np.testing.assert_array_equal(clone[i][0], ds[i][0])
    clone.epoch = 0
    np.testing.assert_array_equal(clone[2][0], before[0])


class _PidDataset(WindowPyDataset):
    """Tags every batch with the id of the process that built it (as sample weights)
    and notes the threads that built them in this process."""

    threads: ClassVar[set[int]] = set()

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        x, y = super().__getitem__(index)
        self.threads.add(threading.get_ident())
        return x, y, np.full(len(x), os.getpid(), dtype=np.float64)


@pytest.mark.parametrize(("workers", "use_multiprocessing"),
                         [(1, False), (2, False), (2, True)],
                         ids=["main-thread", "2-threads", "2-processes"])
def test_keras_workers_read_every_window_once(store: wk.Store, workers: int,
                                              use_multiprocessing: bool) -> None:
    expected = sorted(window_keys(*_oracle()))
    ds = _PidDataset(store.read_plan("train"), BatchOptions(32),
                     ShuffleOptions(seed=7, cache_bytes=1 << 12), workers=workers,
                     use_multiprocessing=use_multiprocessing)
    reference = store.keras_dataset("train", 32, seed=7, cache_bytes=1 << 12)
    adapter = PyDatasetAdapter(ds, shuffle=False)
    _PidDataset.threads.clear()
    pids = set()
    for epoch in range(2):
        batches = _keras_epoch(adapter)
        assert len(batches) == len(ds) and ds.epoch == epoch + 1
        x, y = _concat([b[:2] for b in batches])
        assert sorted(window_keys(x, y)) == expected
        np.testing.assert_array_equal(x, _epoch(reference)[0])  # batches in index order
        reference.on_epoch_end()
        pids |= {int(b[2][0]) for b in batches}
    if use_multiprocessing:
        assert pids and os.getpid() not in pids  # every batch came from a worker
        assert _no_children_left(), f"worker processes left: {multiprocessing.active_children()}"
    elif workers > 1:
        assert pids == {os.getpid()} and threading.get_ident() not in _PidDataset.threads
    else:
        assert pids == {os.getpid()} and _PidDataset.threads == {threading.get_ident()}


def test_fit_with_worker_processes_ends_cleanly(store: wk.Store) -> None:
    keras.utils.set_random_seed(0)
    train = store.keras_dataset("train", 64, normalize=True, cache_bytes=1 << 12, workers=2,
                                use_multiprocessing=True)
    val = store.keras_dataset("train", 128, shuffle=False, normalize=True, workers=2,
                              use_multiprocessing=True)
    model = keras.Sequential([keras.Input((5, 2)), keras.layers.Flatten(),
                              keras.layers.Dense(4), keras.layers.Reshape((2, 2))])
    model.compile(optimizer="adam", loss="mse")
    history = model.fit(train, validation_data=val, epochs=2, shuffle=False, verbose=0)
    assert len(history.history["loss"]) == 2
    assert np.isfinite(history.history["loss"] + history.history["val_loss"]).all()
    assert train.epoch >= 2  # fit also ends an epoch before the first one
    assert _no_children_left(), f"worker processes left: {multiprocessing.active_children()}"
