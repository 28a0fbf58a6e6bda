"""A Grain source's indices: ``src[i]`` and the batched ``_getitems`` take the
same ones (integers, Python or NumPy; negative ones count from the end) and
refuse the same ones, each with one line: a float is no window
(``_getitems([1.7, 2.2])`` once read windows 1 and 2), a bool is no index, and
an index out of range is named."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import windowkit as wk
from tests.conftest import oracle_windows
from tests.helpers import numbered_series

SPEC = wk.WindowSpec(5, stride=2)


@pytest.fixture
def source(tmp_path: Path) -> tuple[wk.Store, list[np.ndarray]]:
    series = numbered_series([60, 40], features=2)
    return wk.convert(series, tmp_path / "store", format="zarr", window=SPEC), series


def _one_line(exc: BaseException) -> str:
    message = str(exc)
    assert "\n" not in message, message
    return message


@pytest.mark.parametrize("bad", [1.7, 2.0, np.float32(1.0), True, np.True_, "1", None])
def test_a_non_integer_is_refused_alike(source: tuple[wk.Store, list[np.ndarray]],
                                        bad: object) -> None:
    src = source[0].grain_source("train")
    with pytest.raises(TypeError) as single:
        src[bad]  # type: ignore[index]
    with pytest.raises(TypeError) as batched:
        src._getitems([0, bad])  # type: ignore[list-item]
    assert _one_line(single.value) == _one_line(batched.value)
    assert _one_line(single.value).startswith(f"window indices are integers, got {bad!r}")


@pytest.mark.parametrize("bad", [np.array([1.7, 2.2]), np.array([True, False]),
                                 np.array(["1"])])
def test_a_non_integer_array_is_refused(source: tuple[wk.Store, list[np.ndarray]],
                                        bad: np.ndarray) -> None:
    src = source[0].grain_source("train")
    with pytest.raises(TypeError, match=f"window indices are integers, got an array of "
                                        f"{bad.dtype}"):
        src._getitems(bad)  # type: ignore[arg-type]


def test_the_floats_of_the_finding_are_no_windows(
        source: tuple[wk.Store, list[np.ndarray]]) -> None:
    src = source[0].grain_source("train")
    with pytest.raises(TypeError, match=r"got 1\.7 \(float\)"):
        src._getitems([1.7, 2.2])  # type: ignore[list-item]


@pytest.mark.parametrize("bad", [10**6, -10**6, 10**30])
def test_an_index_out_of_range_is_named(source: tuple[wk.Store, list[np.ndarray]],
                                        bad: int) -> None:
    src = source[0].grain_source("train")
    n = len(src)
    want = f"window {bad} is out of range for {n} windows"
    with pytest.raises(IndexError) as single:
        src[bad]
    with pytest.raises(IndexError) as batched:
        src._getitems([0, 1, bad, 2])
    assert _one_line(single.value) == _one_line(batched.value) == want
    with pytest.raises(IndexError, match=f"^window {n} is out of range"):
        src._getitems(np.array([n - 1, n], dtype=np.uint64))


def test_integers_of_every_kind_read_the_same_windows(
        source: tuple[wk.Store, list[np.ndarray]]) -> None:
    store, series = source
    src = store.grain_source("train")
    want = oracle_windows(series, SPEC)[0]
    n = len(src)
    picks = [3, 0, n - 1, -1, -n]
    expected = want[[p % n for p in picks]]
    for indices in (picks, [np.int64(p) for p in picks], np.array(picks, dtype=np.int32),
                    tuple(picks)):
        np.testing.assert_array_equal(np.stack(src._getitems(indices)), expected)
    np.testing.assert_array_equal(np.stack([src[np.int16(p)] for p in picks]), expected)
    assert src._getitems([]) == [] and src._getitems(np.zeros(0, np.int64)) == []
    np.testing.assert_array_equal(np.stack(src._getitems(range(n))), want)
