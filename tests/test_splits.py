"""Splits in every format: chronological, by series and at time points; no row
of one split's windows appears in another split's; statistics from train rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import windowkit as wk
from tests.conftest import oracle_windows

SPEC = wk.WindowSpec(6, stride=2, horizon=1)


def _rows_of(store: wk.Store, split: str) -> set[tuple[int, int]]:
    """Every (series, row) that a window of ``split`` touches."""
    rows: set[tuple[int, int]] = set()
    for series, start, _ in store.index(split).tolist():
        rows |= {(series, start + k) for k in range(SPEC.span)}
    return rows


def _check_split_windows(store: wk.Store, arrays: list[np.ndarray], split: str) -> None:
    index = store.index(split)
    if not len(index):
        return
    x, y = store.windows(split, np.arange(len(index)))
    for i, (series, start, _) in enumerate(index.tolist()):
        np.testing.assert_array_equal(x[i], arrays[series][start:start + SPEC.length])
        np.testing.assert_array_equal(y[i], arrays[series][start + SPEC.length:start + SPEC.span])


def test_chronological_splits_do_not_leak(tmp_path: Path, fmt: str) -> None:
    rng = np.random.default_rng(0)
    arrays = [rng.normal(size=(n, 3)).astype(np.float32) for n in (200, 57, 9, 120)]
    store = wk.convert(arrays, tmp_path / "s", format=fmt, window=SPEC,
                       splits={"train": 0.7, "val": 0.15, "test": 0.15}, block_rows=32)
    assert set(store.splits) == {"train", "val", "test"}
    seen: set[tuple[int, int]] = set()
    for split in ("train", "val", "test"):
        rows = _rows_of(store, split)
        assert not rows & seen, f"{split} shares rows with an earlier split"
        seen |= rows
        _check_split_windows(store, arrays, split)
    for sid, a in enumerate(arrays):  # each split: the windows inside its row range
        bounds = np.rint(len(a) * np.array([0, 0.7, 0.85, 1.0])).astype(int)
        for k, split in enumerate(("train", "val", "test")):
            expected = oracle_windows([a[bounds[k]:bounds[k + 1]]], SPEC)[0]
            got = store.index(split)
            assert (got[:, 0] == sid).sum() == len(expected)
    # statistics from training rows only
    train = np.concatenate([a[:int(np.rint(len(a) * 0.7))] for a in arrays]).astype(np.float64)
    stats = store.manifest.normalization
    np.testing.assert_allclose(stats["mean"], train.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(stats["std"], train.std(axis=0), rtol=1e-12)
    np.testing.assert_allclose(stats["min"], train.min(axis=0))


def test_split_by_series_assigns_whole_series(tmp_path: Path, fmt: str) -> None:
    arrays = {f"s{i}": np.full((30, 2), i, dtype=np.float32) for i in range(20)}
    store = wk.convert(arrays, tmp_path / "s", format=fmt, window=SPEC,
                       splits="train=0.6,val=0.4", split_by="series", seed=3)
    train = set(store.index("train")[:, 0].tolist())
    val = set(store.index("val")[:, 0].tolist())
    assert len(train) == 12 and len(val) == 8 and not train & val
    for split in ("train", "val"):  # whole series: every window of it
        assert store.num_windows(split) == len({"train": train, "val": val}[split]) * \
            SPEC.num_windows(30)
    again = wk.convert(arrays, tmp_path / "again", format=fmt, window=SPEC,
                       splits="train=0.6,val=0.4", split_by="series", seed=3)
    assert set(again.index("train")[:, 0].tolist()) == train
    other = wk.convert(arrays, tmp_path / "other", format=fmt, window=SPEC,
                       splits="train=0.6,val=0.4", split_by="series", seed=4)
    assert set(other.index("train")[:, 0].tolist()) != train


def test_split_at_time_points(tmp_path: Path, fmt: str) -> None:
    rng = np.random.default_rng(1)
    frame = pd.DataFrame([{"country": c, "year": y, "gdp": rng.normal()}
                          for c in ("AT", "BE", "CH") for y in range(1980, 2021)])
    frame.to_csv(tmp_path / "panel.csv", index=False)
    store = wk.convert(tmp_path / "panel.csv", tmp_path / "s", format=fmt, window=SPEC,
                       series_col="country", time_col="year", split_at="2000,2010")
    assert set(store.splits) == {"train", "val", "test"}
    years = frame.groupby("country", sort=False)["year"].apply(np.array).tolist()
    for split, (lo, hi) in {"train": (1980, 1999), "val": (2000, 2009),
                            "test": (2010, 2020)}.items():
        index = store.index(split)
        assert len(index)
        for series, start, _ in index.tolist():
            touched = years[series][start:start + SPEC.span]
            assert lo <= touched.min() and touched.max() <= hi
    assert store.info["splits"]["val"]["first_time"] == 2000


@pytest.mark.parametrize(("value", "message"), [
    ("train=0.8,val", "does not parse"),
    ("train=0.8,val=0.3", "split fractions sum to 1.1, over 1"),
    ("train=abc", "the fraction is not a number"),
    ("train=0.5,train=0.5", "split 'train' appears twice"),
])
def test_bad_split_options(tmp_path: Path, value: str, message: str) -> None:
    with pytest.raises(wk.InvalidSpecError, match=message):
        wk.convert([np.zeros((50, 2))], tmp_path / "s", window=4, splits=value)
    assert not list(tmp_path.iterdir())
