"""Splits in every format: chronological, by series and at time points; no row
of one split's windows appears in another split's; statistics from train rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import windowkit as wk
from tests.conftest import oracle_windows
from windowkit.cli import main

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


def test_chronological_splits_do_not_leak(tmp_path: Path, concept_format: str) -> None:
    rng = np.random.default_rng(0)
    arrays = [rng.normal(size=(n, 3)).astype(np.float32) for n in (200, 57, 9, 120)]
    store = wk.convert(arrays, tmp_path / "s", format=concept_format, window=SPEC,
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
    np.testing.assert_allclose(stats.mean, train.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(stats.std, train.std(axis=0), rtol=1e-12)
    np.testing.assert_allclose(stats.min, train.min(axis=0))


@pytest.mark.parametrize(("options", "names"), [
    ({"split_by": "series", "split_at": "1980"}, ('split_by="series"', "split_at")),
    ({"split_by": "series"}, ('split_by="series"', "splits")),
])
def test_split_options_that_contradict_each_other_are_one_line(
        tmp_path: Path, options: dict[str, str], names: tuple[str, str]) -> None:
    """Neither silently wins (split_at used to, splitting by time)."""
    arrays = {f"s{i}": np.full((30, 2), i, dtype=np.float32) for i in range(4)}
    with pytest.raises(wk.InvalidSpecError) as caught:
        wk.convert(arrays, tmp_path / "s", format="zarr", window=SPEC, **options)
    assert all(name in str(caught.value) for name in names), str(caught.value)
    assert "\n" not in str(caught.value) and not (tmp_path / "s").exists()


def test_split_by_series_assigns_whole_series(tmp_path: Path, concept_format: str) -> None:
    arrays = {f"s{i}": np.full((30, 2), i, dtype=np.float32) for i in range(20)}
    store = wk.convert(arrays, tmp_path / "s", format=concept_format, window=SPEC,
                       splits="train=0.6,val=0.4", split_by="series", seed=3)
    train = set(store.index("train")[:, 0].tolist())
    val = set(store.index("val")[:, 0].tolist())
    assert len(train) == 12 and len(val) == 8 and not train & val
    for split in ("train", "val"):  # whole series: every window of it
        assert store.num_windows(split) == len({"train": train, "val": val}[split]) * \
            SPEC.num_windows(30)
    again = wk.convert(arrays, tmp_path / "again", format=concept_format, window=SPEC,
                       splits="train=0.6,val=0.4", split_by="series", seed=3)
    assert set(again.index("train")[:, 0].tolist()) == train
    other = wk.convert(arrays, tmp_path / "other", format=concept_format, window=SPEC,
                       splits="train=0.6,val=0.4", split_by="series", seed=4)
    assert set(other.index("train")[:, 0].tolist()) != train


def test_split_at_time_points(tmp_path: Path, concept_format: str) -> None:
    rng = np.random.default_rng(1)
    frame = pd.DataFrame([{"country": c, "year": y, "gdp": rng.normal()}
                          for c in ("AT", "BE", "CH") for y in range(1980, 2021)])
    frame.to_csv(tmp_path / "panel.csv", index=False)
    store = wk.convert(tmp_path / "panel.csv", tmp_path / "s", format=concept_format, window=SPEC,
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


def _three_countries(tmp_path: Path) -> Path:
    rng = np.random.default_rng(1)
    frame = pd.DataFrame([{"country": c, "year": y, "gdp": rng.normal()}
                          for c in ("AT", "BE", "CH") for y in range(1980, 2021)])
    frame.to_csv(tmp_path / "panel.csv", index=False)
    return tmp_path / "panel.csv"


def test_split_at_names_its_splits_with_split(tmp_path: Path) -> None:
    """``--split fit,check,hold`` names the splits that ``--split-at`` makes."""
    args = ["convert", str(_three_countries(tmp_path)), "--format", "zarr", "--window", "4",
            "--series-col", "country", "--time-col", "year", "--split-at", "2000,2010", "-q"]
    result = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "s"), "--split",
                                       "fit,check,hold"])
    assert result.exit_code == 0, result.output
    named = wk.open_store(tmp_path / "s")
    plain = wk.convert(tmp_path / "panel.csv", tmp_path / "plain", window=4,
                       series_col="country", time_col="year", split_at="2000,2010")
    assert set(named.splits) == {"fit", "check", "hold"}
    for mine, default in [("fit", "train"), ("check", "val"), ("hold", "test")]:
        assert len(named.index(mine)) > 0
        np.testing.assert_array_equal(named.index(mine), plain.index(default))


@pytest.mark.parametrize("splits", ["train=0.1,val=0.1,test=0.1", {"a": 0.5, "b": 0.2, "c": 0.3}])
def test_split_fractions_with_split_at_are_one_line(tmp_path: Path,
                                                   splits: str | dict[str, float]) -> None:
    """Fractions given with split points are refused, never silently ignored."""
    with pytest.raises(wk.InvalidSpecError) as caught:
        wk.convert(_three_countries(tmp_path), tmp_path / "s", window=4, series_col="country",
                   time_col="year", split_at="2000,2010", splits=splits)
    message = str(caught.value)
    assert "gives fractions" in message and "split_at" in message and "\n" not in message
    assert 'splits="train,val,test"' in message and not (tmp_path / "s").exists()
    result = CliRunner().invoke(main, [
        "convert", str(tmp_path / "panel.csv"), "--format", "zarr", "--out", str(tmp_path / "s"),
        "--window", "4", "--series-col", "country", "--time-col", "year", "--split-at",
        "2000,2010", "--split", "fit=0.5,check=0.5"])
    assert result.exit_code == 2 and result.output.count("\n") == 1
    assert "--split fit=0.5,check=0.5 gives fractions, and --split-at cuts" in result.output


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


# -- split context: forecasting windows whose inputs reach back before their split ----------
def _context_oracle(rows: int, lo: int, hi: int, spec: wk.WindowSpec) -> list[int]:
    """Starts of the windows of split rows ``[lo, hi)`` under ``history``: every
    target row in the split, every input row in the series before ``hi``; on the
    series' stride grid (starts ``k * stride``)."""
    L, H, R, S = spec.length, spec.horizon, spec.sampling_rate, spec.stride  # noqa: N806
    ok = [s for s in range(rows)
          if s + L * R >= lo and s + (L + H - 1) * R < hi]
    return [s for s in ok if s % S == 0]


def test_history_context_counts_match_the_oracle(tmp_path: Path, concept_format: str) -> None:
    """Every format: each series' validation and test windows are exactly the
    oracle's, their targets inside the split, and no validation or test target
    lies in a training window."""
    spec = wk.WindowSpec(5, stride=2, sampling_rate=2, horizon=3)
    rng = np.random.default_rng(1)
    lengths = (200, 57, 31, 120, 12)
    arrays = [rng.normal(size=(n, 2)).astype(np.float32) for n in lengths]
    fractions = {"train": 0.6, "val": 0.2, "test": 0.2}
    store = wk.convert(arrays, tmp_path / "s", format=concept_format, window=spec, splits=fractions,
                       split_context="history", block_rows=32)
    cuts = np.cumsum([0.0, *fractions.values()])
    for split_k, split in enumerate(fractions):
        index = store.index(split)
        for sid, n in enumerate(lengths):
            lo, hi = np.rint(n * cuts[split_k:split_k + 2]).astype(int)
            want = (oracle_starts(n, lo, hi, spec) if split == "train"
                    else _context_oracle(n, lo, hi, spec))
            assert index[index[:, 0] == sid, 1].tolist() == want, (split, sid)
    train_rows = {(s, r) for s, start, _ in store.index("train").tolist()
                  for r in range(start, start + spec.span, spec.sampling_rate)}
    for split in ("val", "test"):
        x, y = store.windows(split, np.arange(store.num_windows(split)))
        for i, (s, start, _) in enumerate(store.index(split).tolist()):
            targets = range(start + spec.length * 2, start + spec.span, 2)
            assert not {(s, r) for r in targets} & train_rows
            np.testing.assert_array_equal(x[i], arrays[s][start:start + 10:2])
            np.testing.assert_array_equal(y[i], arrays[s][start + 10:start + spec.span:2])


def oracle_starts(rows: int, lo: int, hi: int, spec: wk.WindowSpec) -> list[int]:
    """Starts on the series' stride grid of the windows lying wholly in rows
    ``[lo, hi)`` (``none``)."""
    span = (spec.length + spec.horizon - 1) * spec.sampling_rate + 1
    return list(range(-(-lo // spec.stride) * spec.stride, hi - span + 1, spec.stride))


@settings(max_examples=40, deadline=None)
@given(length=st.integers(1, 6), horizon=st.integers(0, 4), stride=st.integers(1, 3),
       rate=st.integers(1, 3), rows=st.lists(st.integers(1, 60), min_size=1, max_size=4),
       train=st.floats(0.2, 0.8))
def test_history_context_for_any_window_and_cut(length: int, horizon: int, stride: int,
                                                rate: int, rows: list[int], train: float
                                                ) -> None:
    """Split plan level, over window shapes and cut points: training windows
    stay in the training rows; validation windows are the oracle's (with no
    horizon, exactly those of ``none``)."""
    from windowkit.splits import SplitPlan

    spec = wk.WindowSpec(length, stride=stride, sampling_rate=rate, horizon=horizon)
    plan = SplitPlan.chronological(np.array(rows), {"train": train, "val": 1 - train})
    history = length * rate if horizon else 0
    for k in (0, 1):
        reach = plan.window_ranges(k, context="history", history_rows=history)
        for sid, n in enumerate(rows):
            lo, hi = plan.ranges[sid, k]
            got = oracle_starts(n, int(reach[sid, 0]), int(hi), spec) if hi > lo else []
            if k == 0 or horizon == 0:
                assert got == (oracle_starts(n, int(lo), int(hi), spec) if hi > lo else [])
            else:
                assert got == _context_oracle(n, int(lo), int(hi), spec)


def test_history_context_changes_nothing_by_series_or_without_a_horizon(tmp_path: Path
                                                                        ) -> None:
    arrays = [np.arange(n * 2, dtype=np.float32).reshape(n, 2) for n in (80, 60, 45, 90)]
    for spec, by in ((wk.WindowSpec(6, horizon=2), "series"), (wk.WindowSpec(6), "time")):
        stores = [wk.convert(arrays, tmp_path / f"{by}-{context}", format="zarr", window=spec,
                             splits="train=0.5,val=0.5", split_by=by, split_context=context)
                  for context in ("none", "history")]
        for split in ("train", "val"):
            np.testing.assert_array_equal(stores[0].index(split), stores[1].index(split))


def test_a_bad_split_context_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(wk.InvalidSpecError, match="split_context must be 'none' or 'history'"):
        wk.convert([np.zeros((50, 2), np.float32)], tmp_path / "s", window=4,
                   split_context="future")
    assert not (tmp_path / "s").exists()
