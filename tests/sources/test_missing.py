"""Missing values: refused by default, or with ``nan="skip"`` (``--nan skip``) kept
as rows while every window touching one is left out of the index, in every
format and from every kind of source."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import windowkit as wk
from tests.conftest import assert_windows_equal, collect_epoch, oracle_windows
from windowkit.cli import main
from windowkit.conversion import PartResult, true_runs
from windowkit.index import stretches_without
from windowkit.stats import RunningStats

SPEC = wk.WindowSpec(6, stride=1, horizon=2)


def _stations() -> pd.DataFrame:
    """Two weather stations logging hourly, with empty cells, a NaN, an inf, a
    run of missing hours (values absent, rows present) and a clock gap."""
    rng = np.random.default_rng(7)
    parts = []
    for name, n in [("alpine", 120), ("coast", 90)]:
        t = pd.date_range("2024-01-01", periods=n, freq="h")
        frame = pd.DataFrame({"station": name, "time": t,
                              "temp": rng.normal(5, 3, n), "wind": rng.gamma(2, 2, n)})
        parts.append(frame)
    alpine, coast = parts
    alpine.loc[10, "temp"] = np.nan
    alpine.loc[40:47, "wind"] = np.nan  # a sensor outage of 8 hours
    alpine.loc[80, "temp"] = np.inf
    coast.loc[0, "wind"] = np.nan  # the very first row
    coast.loc[89, "temp"] = np.nan  # the very last row
    coast = coast.drop(index=range(50, 55))  # a clock gap: no rows at all
    return pd.concat([alpine, coast], ignore_index=True)


def _oracle(frame: pd.DataFrame, spec: wk.WindowSpec
            ) -> tuple[np.ndarray, np.ndarray | None]:
    """Windows of each run of rows that are finite and without a time gap."""
    pieces = []
    for _, group in frame.groupby("station", sort=False):
        values = group[["temp", "wind"]].to_numpy()
        hours = group["time"].to_numpy().astype("datetime64[h]").astype(np.int64)
        breaks = ~np.isfinite(values).all(axis=1)
        start = 0
        for i in range(len(values) + 1):
            end_here = i == len(values) or breaks[i] or (i > start and hours[i] - hours[i - 1] > 1)
            if end_here:
                if i > start:
                    pieces.append(values[start:i])
                start = i + 1 if i < len(values) and breaks[i] else i
    return oracle_windows(pieces, spec)


def _source(frame: pd.DataFrame, kind: str, tmp_path: Path) -> object:
    if kind == "csv":
        path = tmp_path / "stations.csv"
        frame.to_csv(path, index=False)  # NaN becomes an empty cell, inf stays "inf"
        return path
    if kind == "parquet":
        path = tmp_path / "stations.parquet"
        frame.to_parquet(path, index=False)
        return path
    return frame


@pytest.mark.parametrize("kind", ["csv", "parquet", "dataframe"])
def test_skip_leaves_out_exactly_the_windows_touching_missing_values(
        tmp_path: Path, concept_format: str, kind: str) -> None:
    frame = _stations()
    store = wk.convert(_source(frame, kind, tmp_path), tmp_path / "s", format=concept_format,
                       window=SPEC,
                       series_col="station", time_col="time", nan="skip")
    want_x, want_y = _oracle(frame, SPEC)
    assert store.num_windows("train") == len(want_x)
    x, y = store.windows("train", np.arange(store.num_windows("train")))
    assert_windows_equal(x, y, want_x, want_y, in_order=True)
    # the readers: every window once, and never a NaN
    x, y = collect_epoch(store.tf_dataset("train", 32, seed=1))
    assert_windows_equal(x, y, want_x, want_y, in_order=False)
    keras = store.keras_dataset("train", 32, seed=1)
    batches = [keras[i] for i in range(len(keras))]
    kx = np.concatenate([b[0] for b in batches])
    ky = np.concatenate([b[1] for b in batches])
    assert_windows_equal(kx, ky, want_x, want_y, in_order=False)
    assert np.isfinite(kx).all() and np.isfinite(ky).all()
    info = store.manifest.series
    assert info.missing_rows == 1 + 8 + 1 + 1 + 1
    assert info.nan_skipped_windows > 0 and info.gap_skipped_windows > 0


def test_statistics_leave_out_rows_with_missing_values(tmp_path: Path, concept_format: str) -> None:
    frame = _stations()
    store = wk.convert(frame, tmp_path / "s", format=concept_format, window=SPEC,
                       series_col="station",
                       time_col="time", nan="skip")
    values = frame[["temp", "wind"]].to_numpy()
    finite = values[np.isfinite(values).all(axis=1)]
    stats = store.manifest.normalization
    assert stats is not None and stats.count == len(finite)
    np.testing.assert_allclose(stats.mean, finite.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(stats.std, finite.std(axis=0), rtol=1e-12)
    x, _ = store.windows("train", np.arange(store.num_windows("train")), normalize=True)
    assert np.isfinite(x).all()


@pytest.mark.parametrize("kind", ["csv", "parquet", "dataframe"])
def test_missing_values_are_refused_by_default(tmp_path: Path, kind: str) -> None:
    frame = _stations()
    with pytest.raises(wk.SourceError, match=r"series 'alpine', row 10, column 'temp' is "
                                             r"missing.*nan=.skip.") as caught:
        wk.convert(_source(frame, kind, tmp_path), tmp_path / "s", format="zarr", window=SPEC,
                   series_col="station", time_col="time")
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "s").exists()


def test_infinity_is_refused_by_default_naming_the_column(tmp_path: Path) -> None:
    frame = _stations()
    frame[["temp", "wind"]] = frame[["temp", "wind"]].fillna(1.0)  # only the inf is left
    with pytest.raises(wk.SourceError, match=r"series 'alpine'.*row 80, column 'temp' is inf"):
        wk.convert(frame, tmp_path / "s", format="parquet", window=SPEC,
                   series_col="station", time_col="time")


def test_cli_nan_skip_on_npy_series(tmp_path: Path, concept_format: str) -> None:
    rng = np.random.default_rng(0)
    a = rng.normal(size=(200, 3)).astype(np.float32)
    b = rng.normal(size=(150, 3)).astype(np.float32)
    a[[20, 21, 99], 1] = np.nan
    b[0, 2] = -np.inf
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    args = ["convert", str(tmp_path / "a.npy"), str(tmp_path / "b.npy"), "--format", concept_format,
            "--window", "6", "--horizon", "2", "-q"]
    refused = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "no")])
    assert refused.exit_code == 2
    assert "a.npy: row 20, column 1 is nan" in refused.output
    assert not (tmp_path / "no").exists()
    done = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "s"), "--nan", "skip"])
    assert done.exit_code == 0, done.output
    store = wk.open_store(tmp_path / "s")
    pieces = [a[:20], a[22:99], a[100:], b[1:]]
    want_x, want_y = oracle_windows(pieces, SPEC)
    x, y = store.windows("train", np.arange(store.num_windows("train")))
    assert_windows_equal(x, y, want_x, want_y, in_order=True)
    shown = CliRunner().invoke(main, ["inspect", str(tmp_path / "s")])
    skipped = store.manifest.series.nan_skipped_windows
    assert f"{skipped:,} (they touch one of 4 rows with NaN or inf)" in shown.output


def test_skip_with_splits_and_workers(tmp_path: Path, concept_format: str) -> None:
    frame = _stations()
    store = wk.convert(frame, tmp_path / "s", format=concept_format, window=SPEC,
                       series_col="station",
                       time_col="time", nan="skip", splits="train=0.7,val=0.3", workers=2,
                       block_rows=16, parts=3)
    total = sum(store.num_windows(s) for s in store.splits)
    assert total <= len(_oracle(frame, SPEC)[0])
    for split in store.splits:
        x, y = store.windows(split, np.arange(store.num_windows(split)))
        assert np.isfinite(x).all() and np.isfinite(y).all()


def test_skip_needs_float_columns(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text("id,t,count\na,0,1\na,1,\na,2,3\n")
    with pytest.raises(wk.SourceError, match=r"row 1, column 'count' is missing.*needs float"):
        wk.convert(tmp_path / "t.csv", tmp_path / "s", window=2, series_col="id", time_col="t",
                   nan="skip")


def test_bad_nan_option(tmp_path: Path) -> None:
    with pytest.raises(wk.InvalidSpecError, match="nan must be 'error' or 'skip'"):
        wk.convert(np.zeros((10, 2)), tmp_path / "s", window=2, nan="drop")


def test_missing_runs_survive_a_resume_marker() -> None:
    runs = true_runs(np.array([True, False, True, True, False, False, True]))
    assert runs.tolist() == [[0, 1], [2, 4], [6, 7]]
    result = PartResult({"n": 1}, RunningStats(), 7, [], "digest", runs + 100)
    again = PartResult.from_marker(result.to_marker())
    assert again.missing.tolist() == [[100, 101], [102, 104], [106, 107]]
    assert again.source_digest == "digest"
    assert PartResult.from_marker({**result.to_marker(), "missing": []}).missing.shape == (0, 2)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=60), st.data())
def test_stretches_without_holes_are_the_rows_left(mask: list[bool], data: st.DataObject
                                                   ) -> None:
    n = len(mask)
    cuts = sorted(data.draw(st.sets(st.integers(1, n - 1), max_size=4)) if n > 1 else set())
    stretches = list(itertools.pairwise([0, *cuts, n]))
    got = stretches_without(stretches, true_runs(np.array(mask)))
    kept = np.zeros(n, dtype=bool)
    for a, b in got:
        assert a < b and not any(mask[a:b])
        kept[a:b] = True
    assert (kept == ~np.array(mask)).all()
    # no stretch crosses one of the original cuts
    assert all(not (a < c < b) for a, b in got for c in cuts)
