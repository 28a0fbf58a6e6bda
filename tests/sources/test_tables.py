"""Table sources (CSV, Parquet, DataFrames) in every format: long and wide form,
time columns, gaps, and real-looking panels, short series and sensor logs."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import windowkit as wk
from tests.conftest import oracle_windows, oracle_windows_within
from windowkit.cli import main


def _segments(times: np.ndarray, max_gap: int | None = None) -> list[tuple[int, int]]:
    diffs = np.diff(times)
    if len(diffs) == 0:
        return [(0, len(times))]
    values, counts = np.unique(diffs, return_counts=True)
    gap = max_gap or values[np.argmax(counts)] * 3 // 2  # a missed sample
    cuts = [0, *(np.flatnonzero(diffs > gap) + 1).tolist(), len(times)]
    return list(itertools.pairwise(cuts))


def _expected(frame: pd.DataFrame, spec: wk.WindowSpec, *, series: str | None, time: str | None,
              features: list[str], max_gap: int | None = None) -> np.ndarray:
    """The oracle: each series' windows on its stride grid, less those spanning a gap."""
    groups = [frame] if series is None else [g for _, g in frame.groupby(series, sort=False)]
    pieces = []
    for group in groups:
        values = group[features].to_numpy()
        if time is None:
            pieces.append(oracle_windows([values], spec)[0])
            continue
        stamps = group[time]
        if stamps.dtype.kind == "M":  # timestamps: nanoseconds in UTC
            stamps = stamps.dt.tz_convert("UTC").dt.tz_localize(None) if stamps.dt.tz else stamps
            times = stamps.to_numpy().astype("datetime64[ns]").astype(np.int64)
        else:
            times = stamps.to_numpy().astype(np.int64)
        pieces.append(oracle_windows_within(values, spec, list(_segments(times, max_gap))))
    return np.concatenate(pieces)


def _all_windows(store: wk.Store) -> np.ndarray:
    got = store.windows("train", np.arange(store.num_windows("train")))
    return got[0] if isinstance(got, tuple) else got


def _sensor_log() -> pd.DataFrame:
    """Two sensors sampled each second, with a dropout and a clock in UTC+1."""
    rng = np.random.default_rng(3)
    parts = []
    for name, n in [("north", 300), ("south", 180)]:
        t = pd.date_range("2025-03-01 12:00", periods=n, freq="s", tz="Europe/Berlin")
        keep = np.ones(n, bool)
        keep[100:130] = False  # a 31 s dropout
        parts.append(pd.DataFrame({"sensor": name, "time": t[keep],
                                   "temp": rng.normal(20, 1, keep.sum()),
                                   "humidity": rng.uniform(30, 60, keep.sum())}))
    return pd.concat(parts, ignore_index=True)


def _panel() -> pd.DataFrame:
    """Countries x years (integer time), one country missing two years."""
    rng = np.random.default_rng(4)
    rows = []
    for country in ["AT", "BE", "CH", "DK"]:
        years = [y for y in range(1990, 2021) if not (country == "CH" and y in (2001, 2002))]
        for year in years:
            rows.append({"country": country, "year": year, "gdp": rng.normal(100, 5),
                         "pop": int(rng.integers(1_000, 9_000))})
    return pd.DataFrame(rows)


def _short_series() -> pd.DataFrame:
    """Many short series of varying length, some shorter than a window."""
    rng = np.random.default_rng(5)
    parts = [pd.DataFrame({"id": f"s{i:03d}", "t": np.arange(n), "v": rng.normal(size=n)})
             for i, n in enumerate(rng.integers(1, 30, size=120))]
    return pd.concat(parts, ignore_index=True)


CASES = {  # name: (frame, series column, time column, features, window)
    "sensor": (_sensor_log, "sensor", "time", ["temp", "humidity"], wk.WindowSpec(16, horizon=2)),
    "panel": (_panel, "country", "year", ["gdp", "pop"], wk.WindowSpec(5, stride=2)),
    "short": (_short_series, "id", "t", ["v"], wk.WindowSpec(8)),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("kind", ["csv", "parquet", "dataframe"])
def test_real_looking_tables_give_the_oracle_windows(tmp_path: Path, concept_format: str, case: str,
                                                     kind: str) -> None:
    make, series, time, features, spec = CASES[case]
    frame = make()
    if kind == "csv":
        source: object = tmp_path / "t.csv"
        frame.to_csv(source, index=False)
    elif kind == "parquet":
        source = tmp_path / "t.parquet"
        frame.to_parquet(source, index=False)
    else:
        source = frame
    store = wk.convert(source, tmp_path / "store", format=concept_format, window=spec,
                       series_col=series,
                       time_col=time, columns=features)
    expected = _expected(frame, spec, series=series, time=time, features=features)
    assert store.num_windows("train") == len(expected)
    np.testing.assert_allclose(_all_windows(store), expected.astype(store.dtype))
    assert store.manifest.columns == features
    table = pq.read_table(store.path / "series.parquet").to_pandas()
    assert table["key"].tolist() == list(dict.fromkeys(frame[series].astype(str)))
    first = frame.groupby(series, sort=False)[time].first()
    if frame[time].dtype.kind == "M":
        first = first.dt.tz_convert("UTC").dt.tz_localize(None).astype("datetime64[ns]")
        first = first.astype(np.int64)
    assert table["first_time"].tolist() == first.tolist()
    unrestricted = sum(spec.num_windows(n) for n in frame.groupby(series, sort=False).size())
    assert store.manifest.series.gap_skipped_windows == unrestricted - len(expected)


def test_max_gap_lets_windows_span_larger_steps(tmp_path: Path, concept_format: str) -> None:
    frame = _sensor_log()
    frame.to_csv(tmp_path / "log.csv", index=False)
    result = CliRunner().invoke(main, [
        "convert", str(tmp_path / "log.csv"), "--format", concept_format,
        "--out", str(tmp_path / "s"),
        "--window", "16", "--series-col", "sensor", "--time-col", "time",
        "--columns", "temp,humidity", "--max-gap", "1min", "-q"])
    assert result.exit_code == 0, result.output
    store = wk.open_store(tmp_path / "s")
    expected = _expected(frame, wk.WindowSpec(16), series="sensor", time="time",
                         features=["temp", "humidity"], max_gap=60 * 10**9)
    assert store.num_windows("train") == len(expected) == (300 - 30 - 15) + (180 - 30 - 15)
    inspect = CliRunner().invoke(main, ["inspect", str(tmp_path / "s")])
    assert "time column      time" in inspect.output
    assert "windows skipped" not in inspect.output


def test_a_wide_csv_is_one_series(tmp_path: Path, concept_format: str) -> None:
    values = np.random.default_rng(0).normal(size=(200, 4))
    pd.DataFrame(values, columns=list("abcd")).to_csv(tmp_path / "wide.csv", index=False)
    store = wk.convert(tmp_path / "wide.csv", tmp_path / "s", format=concept_format, window=10)
    assert store.manifest.series.count == 1 and store.manifest.columns == list("abcd")
    np.testing.assert_allclose(_all_windows(store), oracle_windows([values], wk.WindowSpec(10))[0])


def test_table_options_need_a_table_source(tmp_path: Path) -> None:
    with pytest.raises(wk.InvalidSpecError, match="apply to table sources"):
        wk.convert([np.zeros((50, 2))], tmp_path / "s", window=4, series_col="id")


def test_a_locked_target_is_refused_before_staging(tmp_path: Path) -> None:
    from windowkit.conversion import Workspace

    pd.DataFrame({"v": np.arange(50.0)}).to_csv(tmp_path / "t.csv", index=False)
    running = Workspace(tmp_path / "s")
    running.lock()
    try:
        with pytest.raises(wk.StoreError, match="another windowkit convert is writing"):
            wk.convert(tmp_path / "t.csv", tmp_path / "s", window=4)
        assert not (running.root / "_staging").exists()
    finally:
        running.release()
    assert wk.convert(tmp_path / "t.csv", tmp_path / "s", window=4).num_windows() == 47


def _interleaved_log() -> pd.DataFrame:
    """Three sensors' readings in one log, in time order (so series interleave)."""
    rng = np.random.default_rng(9)
    t = pd.date_range("2025-06-01", periods=200, freq="min", tz="UTC")
    parts = [pd.DataFrame({"sensor": name, "time": t[offset::1][:150],
                           "value": rng.normal(size=150), "load": rng.uniform(size=150)})
             for offset, name in enumerate(["s2", "s10", "s1"])]
    frame = pd.concat(parts).sort_values(["time", "sensor"], kind="stable")
    return frame.reset_index(drop=True)


@pytest.mark.parametrize("kind", ["csv", "parquet", "dataframe"])
def test_interleaved_series_are_grouped_in_memory(tmp_path: Path, concept_format: str,
                                                  kind: str) -> None:
    frame = _interleaved_log()
    source: object = frame
    if kind == "csv":
        source = tmp_path / "log.csv"
        frame.to_csv(source, index=False)
    elif kind == "parquet":
        source = tmp_path / "log.parquet"
        frame.to_parquet(source, index=False)
    spec = wk.WindowSpec(10, stride=4, horizon=1)
    store = wk.convert(source, tmp_path / "s", format=concept_format, window=spec,
                       series_col="sensor",
                       time_col="time", columns=["value", "load"])
    # series in order of first appearance, each series' rows in table order
    table = pq.read_table(store.path / "series.parquet").to_pandas()
    assert table["key"].tolist() == ["s2", "s10", "s1"]
    groups = [frame[frame.sensor == k][["value", "load"]].to_numpy() for k in ["s2", "s10", "s1"]]
    want_x, want_y = oracle_windows(groups, spec)
    x, y = store.windows("train", np.arange(store.num_windows("train")))
    np.testing.assert_array_equal(x, want_x)
    np.testing.assert_array_equal(y, want_y)


def test_interleaved_table_over_the_budget_is_refused(tmp_path: Path) -> None:
    _interleaved_log().to_csv(tmp_path / "log.csv", index=False)
    result = CliRunner().invoke(main, [
        "convert", str(tmp_path / "log.csv"), "--format", "zarr", "--out", str(tmp_path / "s"),
        "--window", "8", "--series-col", "sensor", "--time-col", "time",
        "--sort-memory", "4KiB"])
    assert result.exit_code == 2
    assert result.output.count("\n") == 1
    assert ("rows of series 's2' are not grouped together (it appears again at row 2); sort the "
            "table by 'sensor' and 'time' first (the table is larger than the memory budget "
            "for sorting it here, --sort-memory 4.0 KiB)" in result.output)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.csv"]


def test_errors_after_grouping_name_the_table_row(tmp_path: Path) -> None:
    frame = _interleaved_log()
    frame.loc[299, "value"] = np.nan  # the 101st reading of s2, in the table's numbering
    assert frame.loc[299, "sensor"] == "s2"
    with pytest.raises(wk.SourceError, match=r"series 's2', row 299, column 'value' is missing"):
        wk.convert(frame, tmp_path / "s", window=8, series_col="sensor", time_col="time")
    frame = _interleaved_log()
    frame.loc[[4, 7], "time"] = frame.loc[[7, 4], "time"].to_numpy()  # s10 goes back in time
    with pytest.raises(wk.SourceError, match=r"series 's10', row 7: time goes back"):
        wk.convert(frame, tmp_path / "s", window=8, series_col="sensor", time_col="time")


def test_dataframes_are_identified_by_their_content(tmp_path: Path) -> None:
    from windowkit.sources import TableOptions, stage_table

    def source_id(frame: pd.DataFrame) -> str:
        staging = tmp_path / f"stage{len(list(tmp_path.iterdir()))}"
        staging.mkdir()
        return stage_table(frame, TableOptions("sensor", "time"), staging)[0].source_id

    frame = _interleaved_log()
    first = source_id(frame)
    assert source_id(frame.copy()) == first
    changed = frame.copy()
    changed.loc[0, "load"] += 1.0
    assert source_id(changed) != first
