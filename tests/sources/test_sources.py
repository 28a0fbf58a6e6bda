"""Reading sources: .npy files by byte range, globs, lists, dicts; clear errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import windowkit as wk
from windowkit.sources import NpySeries, open_sources


def test_npy_is_read_by_block_without_loading(tmp_path: Path) -> None:
    values = np.arange(3000, dtype=np.float32).reshape(1000, 3)
    np.save(tmp_path / "a.npy", values)
    series = NpySeries.open(str(tmp_path / "a.npy"))
    assert (series.rows, series.step_shape, series.dtype) == (1000, (3,), np.float32)
    np.testing.assert_array_equal(series.read(10, 25), values[10:25])


@pytest.mark.parametrize("layout", ["big-endian", "fortran", "int16", "frames"])
def test_npy_layouts_round_trip(tmp_path: Path, layout: str) -> None:
    values = np.arange(240, dtype=np.float64).reshape(60, 4)
    if layout == "big-endian":
        values = values.astype(">f4")
    elif layout == "fortran":
        values = np.asfortranarray(values)
    elif layout == "int16":
        values = values.astype(np.int16)
    else:
        values = values.reshape(60, 1, 2, 2)
    np.save(tmp_path / "a.npy", values)
    store = wk.convert(str(tmp_path / "a.npy"), tmp_path / "s", window=5, block_rows=8)
    got = store.windows("train", [0, 55])
    np.testing.assert_array_equal(got[1], values[55:60])
    assert store.dtype == values.dtype.newbyteorder("=")


def test_glob_list_and_dict_sources(tmp_path: Path) -> None:
    for name, n in [("b", 10), ("a", 12)]:
        np.save(tmp_path / f"{name}.npy", np.full((n, 2), n, dtype=np.float32))
    assert [s.key for s in open_sources(str(tmp_path / "*.npy"))] == ["a", "b"]
    assert [s.rows for s in open_sources([tmp_path / "b.npy", tmp_path / "a.npy"])] == [10, 12]
    arrays = {"x": np.zeros((4, 2)), "y": np.ones((5, 2))}
    assert [(s.key, s.rows) for s in open_sources(arrays)] == [("x", 4), ("y", 5)]
    assert [s.key for s in open_sources([np.zeros(3), np.zeros(4)])] == ["0", "1"]


@pytest.mark.parametrize(("make", "message"), [
    (lambda d: None, "no such file"),
    (lambda d: np.save(d / "x.npy", np.zeros((0, 3))), "series is empty"),
    (lambda d: np.save(d / "x.npy", np.zeros((4, 2), np.complex64)), "dtype complex64 is not"),
    (lambda d: np.save(d / "x.npy", np.array(["a", "b"])), "dtype <U1 is not supported"),
    (lambda d: np.save(d / "x.npy", np.array([1, None]), allow_pickle=True), "dtype object"),
    (lambda d: (d / "x.npy").write_bytes(b"not numpy"), "not a .npy file"),
    (lambda d: (np.save(d / "full.npy", np.zeros((100, 4))),
                (d / "x.npy").write_bytes((d / "full.npy").read_bytes()[:500])), "truncated"),
    (lambda d: np.save(d / "x.npy", np.array([1.0, np.nan, 2.0])), "row 1, column 0 is nan"),
])
def test_bad_npy_sources(tmp_path: Path, make, message: str) -> None:
    make(tmp_path)
    with pytest.raises(wk.SourceError, match=message):
        wk.convert(str(tmp_path / "x.npy"), tmp_path / "s", window=2)
    assert not (tmp_path / "s").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".s.")]


def test_inconsistent_series_are_refused() -> None:
    with pytest.raises(wk.SourceError, match="series '1': step shape \\(3,\\) differs"):
        open_sources([np.zeros((5, 2)), np.zeros((5, 3))])
    with pytest.raises(wk.SourceError, match="series '1': dtype int32 differs"):
        open_sources([np.zeros((5, 2)), np.zeros((5, 2), np.int32)])


def test_infinity_is_named_with_series_row_and_column(tmp_path: Path) -> None:
    values = np.zeros((50, 3), dtype=np.float32)
    values[42, 2] = np.inf
    with pytest.raises(wk.SourceError, match="series 'b': row 42, column 2 is inf"):
        wk.convert({"a": np.zeros((9, 3), np.float32), "b": values}, tmp_path / "s", window=4)
