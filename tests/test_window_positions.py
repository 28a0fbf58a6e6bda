"""``Store.windows`` indexes the split's windows as NumPy indexes an array:
integers of any dtype (negative from the end), slices and boolean masks mean
what they mean in NumPy; a float, a string or a mask of another length is one
line, never a window picked by truncation (``1.9`` is no window 1)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import windowkit as wk


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> wk.Store:
    rng = np.random.default_rng(2)
    arrays = [rng.normal(size=(n, 2)).astype(np.float32) for n in (60, 45)]
    return wk.convert(arrays, tmp_path_factory.mktemp("positions") / "s", format="zarr",
                      window=wk.WindowSpec(6))


def _all(store: wk.Store) -> np.ndarray:
    return np.asarray(store.windows("train", np.arange(store.num_windows("train"))))


@pytest.mark.parametrize("positions", [
    3, -1, [0, 2, -3], np.array([4, 1], dtype=np.uint8), np.array([5], dtype=np.int16),
    slice(0, 3), slice(None, None, -7), slice(10, 2), np.array([], dtype=np.int64), []],
    ids=["int", "negative", "list", "uint8", "int16", "slice", "reversed slice",
         "empty slice", "empty array", "empty list"])
def test_positions_mean_what_numpy_means(store: wk.Store, positions: object) -> None:
    everything = _all(store)
    want = everything[positions] if not isinstance(positions, list) or positions else (
        everything[:0])
    got = np.asarray(store.windows("train", positions))
    np.testing.assert_array_equal(got.reshape(-1, *everything.shape[1:]),
                                  np.reshape(want, (-1, *everything.shape[1:])))


def test_a_boolean_mask_picks_the_windows_where_it_is_true(store: wk.Store) -> None:
    everything = _all(store)
    mask = np.zeros(len(everything), dtype=bool)
    mask[[1, 7]] = True
    np.testing.assert_array_equal(store.windows("train", mask), everything[mask])
    with pytest.raises(IndexError, match="boolean mask"):
        store.windows("train", np.array([True, False]))


@pytest.mark.parametrize("positions", [[1.9], 1.0, np.array([0.5]), ["1"]],
                         ids=["float list", "float", "float array", "strings"])
def test_other_positions_are_one_line(store: wk.Store, positions: object) -> None:
    with pytest.raises(wk.InvalidSpecError, match="window positions are integers") as caught:
        store.windows("train", positions)
    assert "\n" not in str(caught.value)


def test_a_position_out_of_range_is_one_line(store: wk.Store, tmp_path: Path) -> None:
    n = store.num_windows("train")
    for bad in (n, -n - 1):
        with pytest.raises(IndexError, match=f"window position {bad} is out of range"):
            store.windows("train", [0, bad])


def test_positions_of_two_dimensions_are_one_line(store: wk.Store) -> None:
    """``[[0, 1], [2, 3]]`` is not four windows in a row (NumPy would stack them)."""
    with pytest.raises(wk.InvalidSpecError, match=r"one list .* shape \(2, 2\)") as caught:
        store.windows("train", [[0, 1], [2, 3]])
    assert "\n" not in str(caught.value)


def test_no_positions_of_an_empty_split_are_empty_arrays(tmp_path: Path) -> None:
    arrays = [np.zeros((30, 2), np.float32)] * 2
    with pytest.warns(UserWarning, match="split 'val' holds no windows"):
        empty = wk.convert(arrays, tmp_path / "s", format="zarr",
                           window=wk.WindowSpec(8, horizon=2), splits={"train": .7, "val": .3})
    x, y = empty.windows("val", [])
    assert x.shape == (0, 8, 2) and y.shape == (0, 2, 2)
