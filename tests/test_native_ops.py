"""windowkit's compiled ops (``windowkit.native``): the window copy cuts the
windows ``tf.gather`` cuts, for every shape, dtype, length and step; the
epoch starts are the NumPy readers' numbers (keyed permutation, runs with
gaps, held blocks); a start outside the rows is an error; where the ops
cannot be built, readers cut the same batches with TensorFlow's own ops,
said once in the log."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import windowkit as wk
from windowkit import native
from windowkit.index import WindowRuns
from windowkit.readers import index_shuffle

DTYPES = [np.float32, np.float64, np.float16, np.int8, np.uint8, np.int16, np.int32,
          np.int64, np.uint32, np.bool_]

needs_compiler = pytest.mark.skipif(native._compiler() is None, reason="no C++ compiler")


@pytest.fixture
def no_op(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The process as where the op is not available (``WINDOWKIT_NATIVE=0``)."""
    monkeypatch.setenv("WINDOWKIT_NATIVE", "0")
    native._library.cache_clear()
    yield
    monkeypatch.delenv("WINDOWKIT_NATIVE")
    native._library.cache_clear()


@needs_compiler
def test_the_op_is_built_where_a_compiler_is() -> None:
    assert native.available()
    assert native.library_path(native._compiler() or "").exists()


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 30), inner=st.lists(st.integers(0, 3), max_size=2),
       dtype=st.sampled_from(DTYPES), length=st.integers(0, 6), step=st.integers(1, 3),
       count=st.integers(0, 12), seed=st.integers(0, 2**16))
def test_windows_are_the_gathered_rows(rows: int, inner: list[int], dtype: type, length: int,
                                       step: int, count: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    values = (rng.normal(size=(rows, *inner)) * 50).astype(dtype)
    reach = (length - 1) * step + 1 if length else 0
    if reach > rows:
        return
    starts = rng.integers(0, rows - reach + 1, size=count)
    out = native.window_copy(tf.constant(values), tf.constant(starts, tf.int64), length, step)
    expected = values[starts[:, None] + step * np.arange(length)[None]].reshape(
        count, length, *inner)
    assert out.dtype == tf.as_dtype(values.dtype)
    np.testing.assert_array_equal(out.numpy(), expected)


@pytest.mark.parametrize("start", [-1, 8, 2**40])
def test_a_window_outside_the_rows_is_an_error(start: int) -> None:
    values = tf.constant(np.arange(20, dtype=np.float32).reshape(10, 2))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"window|indices"):
        native.window_copy(values, tf.constant([0, start], tf.int64), 3)


def test_shapes_are_known_in_a_graph() -> None:
    @tf.function(input_signature=[tf.TensorSpec([None, 3, 2]), tf.TensorSpec([None], tf.int64)])
    def cut(rows: tf.Tensor, starts: tf.Tensor) -> tf.Tensor:
        windows = native.window_copy(rows, starts, 4, 2)
        assert windows.shape.as_list() == [None, 4, 3, 2]
        return windows

    assert cut(tf.zeros([20, 3, 2]), tf.constant([0, 5], tf.int64)).shape == (2, 4, 3, 2)


@st.composite
def held_layouts(draw: st.DrawFn) -> tuple[WindowRuns, int, np.ndarray]:
    """Runs of windows with gaps over a few series, the held blocks' rows, and
    where each block lands in the held rows (-1: a block without windows)."""
    stride = draw(st.integers(1, 3))
    block_rows = draw(st.integers(1, 16))
    series, first, count, offsets, rows = [], [], [], [], 0
    for sid, n in enumerate(draw(st.lists(st.integers(1, 40), min_size=1, max_size=4))):
        offsets.append(rows)
        start = draw(st.integers(0, 3))
        while start < n:
            run = draw(st.integers(1, 1 + (n - start - 1) // stride))
            series.append(sid)
            first.append(start)
            count.append(run)
            start += (run - 1) * stride + 1 + draw(st.integers(0, 6))
        rows += n
    runs = WindowRuns(np.array(series, np.int32), np.array(first, np.int64),
                      np.array(count, np.int64), stride, np.array(offsets, np.int64))
    blocks = -(-rows // block_rows)
    held = np.unique(runs.global_starts(np.arange(runs.total)) // block_rows)
    base = np.full(blocks, -1, np.int64)
    order = np.random.default_rng(draw(st.integers(0, 2**16))).permutation(len(held))
    base[held[order]] = np.arange(len(held)) * block_rows  # held in any order
    return runs, block_rows, base


def _epoch_starts(runs: WindowRuns, block_rows: int, base: np.ndarray, key: int, lo: int,
                  hi: int) -> tuple[tf.Tensor, tf.Tensor] | None:
    return native.epoch_starts(
        tf.constant(lo, tf.int64), tf.constant(hi, tf.int64), tf.constant(key, tf.uint64),
        size=runs.total, run_first=tf.constant(runs.cumulative[:-1]),
        run_start=tf.constant(runs.global_first), run_series=tf.constant(runs.series),
        stride=runs.stride, block_base=tf.constant(base), block_rows=block_rows)


@needs_compiler
@settings(max_examples=80, deadline=None)
@given(layout=held_layouts(), key=st.integers(0, 2**64 - 1), data=st.data())
def test_epoch_starts_are_the_numpy_readers(layout: tuple[WindowRuns, int, np.ndarray],
                                            key: int, data: st.DataObject) -> None:
    runs, block_rows, base = layout
    lo = data.draw(st.integers(0, runs.total))
    hi = data.draw(st.integers(lo, runs.total))
    positions = index_shuffle(np.arange(lo, hi), runs.total, np.uint64(key))
    starts, series = runs.global_starts_and_series(positions)
    block = starts // block_rows
    out = _epoch_starts(runs, block_rows, base, key, lo, hi)
    assert out is not None
    np.testing.assert_array_equal(out[0].numpy(), base[block] + starts - block * block_rows)
    np.testing.assert_array_equal(out[1].numpy(), series)


@needs_compiler
@pytest.mark.parametrize("size", [1, 2, 5, 4097, 3_200_000, 2**40 + 3])
def test_epoch_starts_permute_as_numpy_at_any_size(size: int) -> None:
    runs = WindowRuns(np.zeros(1, np.int32), np.zeros(1, np.int64), np.array([size]), 1,
                      np.zeros(1, np.int64))
    lo = max(0, size - 3000)
    for key in (0, 1, 2**64 - 1, 0x5DEECE66D):
        out = _epoch_starts(runs, 2**62, np.zeros(1, np.int64), key, lo, size)
        assert out is not None
        np.testing.assert_array_equal(out[0].numpy(),
                                      index_shuffle(np.arange(lo, size), size, np.uint64(key)))


@needs_compiler
def test_epoch_starts_refuse_a_block_not_held() -> None:
    runs = WindowRuns(np.zeros(1, np.int32), np.zeros(1, np.int64), np.array([8]), 1,
                      np.zeros(1, np.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match="not held"):
        _epoch_starts(runs, 4, np.array([0, -1]), 7, 0, 8)
    with pytest.raises(tf.errors.InvalidArgumentError, match="not within"):
        _epoch_starts(runs, 4, np.array([0, 4]), 7, 4, 9)


def _epoch(store: wk.Store) -> list[tuple[np.ndarray, np.ndarray]]:
    ds = store.tf_dataset("train", 7, shuffle=True, seed=3)
    return [(x.numpy(), y.numpy()) for x, y in ds]


def test_readers_cut_the_same_batches_without_the_op(tmp_path: Path,
                                                     request: pytest.FixtureRequest) -> None:
    rng = np.random.default_rng(0)
    series = [rng.normal(size=(n, 3)).astype(np.float32) for n in (40, 57)]
    spec = wk.WindowSpec(length=5, sampling_rate=2, horizon=2)
    wk.convert(series, tmp_path / "s", format="zarr", window=spec, target_columns=[2, 0])
    with_op = _epoch(wk.open_store(tmp_path / "s"))
    request.getfixturevalue("no_op")
    assert not native.available()
    without = _epoch(wk.open_store(tmp_path / "s"))
    assert len(with_op) == len(without) > 1
    for (x1, y1), (x2, y2) in zip(with_op, without, strict=True):
        np.testing.assert_array_equal(x1, x2)
        np.testing.assert_array_equal(y1, y2)


@pytest.mark.parametrize("compiler", ["/nonexistent/c++", "false"])
def test_no_compiler_is_said_once_and_tf_gather_cuts(
        compiler: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("WINDOWKIT_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", compiler)
    if compiler == "false" and shutil.which("false") is None:
        pytest.skip("no `false` command")
    native._library.cache_clear()
    try:
        with pytest.raises(native.BuildError, match="no C.. compiler" if "/" in compiler
                           else "failed"):
            native.build()
        with caplog.at_level(logging.WARNING, logger="windowkit"):
            assert not native.available() and not native.available()
            out = native.window_copy(tf.constant(np.arange(6.0).reshape(6, 1)),
                                     tf.constant([1, 3], tf.int64), 2)
        said = [r for r in caplog.records if "not available" in r.getMessage()]
        assert len(said) == 1 and ("compiler" in said[0].getMessage()
                                   or "failed" in said[0].getMessage())
        np.testing.assert_array_equal(out.numpy()[:, :, 0], [[1, 2], [3, 4]])
        assert not any((tmp_path / "ops").glob("*"))  # nothing half-built left behind
    finally:
        monkeypatch.undo()
        native._library.cache_clear()
