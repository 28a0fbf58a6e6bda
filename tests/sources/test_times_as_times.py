"""Times read as times, from every table source: split points in the time
column's own kind (a year on a date column is its first day), ``--max-gap``
with a unit on dates and timestamps, ISO text times from CSV, Parquet and
DataFrames alike, and a DataFrame's index as its time column.

The data are shaped as real exports: long panels whose series interleave,
dates, timestamps with UTC offsets (across a change to summer time), text
months, and a DataFrame indexed by its dates."""

from __future__ import annotations

import datetime
import itertools
import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner, Result

import windowkit as wk
from tests.conftest import oracle_windows_within
from tests.helpers import assert_one_line_error
from windowkit.cli import main

REAL = Path(__file__).resolve().parents[2] / "fixtures" / "real"
SPEC = wk.WindowSpec(10)


def _markets() -> pd.DataFrame:
    """Two stock indices' closes on business days 1993-2002, one row per index
    and day (date-major: the series interleave), ISO dates."""
    days = pd.bdate_range("1993-01-04", "2002-12-31")
    rng = np.random.default_rng(7)
    frame = pd.DataFrame({"index": np.tile(["DAX", "SMI"], len(days)),
                          "date": np.repeat(days, 2)})
    frame["close"] = 1000 + rng.normal(size=len(frame)).cumsum()
    return frame


def _meters() -> pd.DataFrame:
    """Two electricity meters read every 15 minutes in Berlin time, written
    with their UTC offsets (+01:00, then +02:00 from 28 March 2021), one meter
    out for 45 minutes; the meters' rows interleave."""
    stamps = pd.date_range("2021-03-27", "2021-03-30", freq="15min", tz="Europe/Berlin",
                           inclusive="left")
    rng = np.random.default_rng(11)
    parts = []
    for meter in ("m1", "m2"):
        kept = stamps if meter == "m1" else stamps.delete(range(100, 103))  # 45 min out
        parts.append(pd.DataFrame({"meter": meter, "time": kept,
                                   "kwh": rng.gamma(2.0, 0.3, len(kept))}))
    frame = pd.concat(parts).sort_values(["time", "meter"], kind="stable")
    return frame.reset_index(drop=True)


def _offset_text(stamps: pd.Series) -> pd.Series:
    """Timestamps as an export writes them: ISO with the UTC offset, +01:00."""
    text = stamps.dt.strftime("%Y-%m-%dT%H:%M:%S%z")
    return text.str.replace(r"([+-]\d{2})(\d{2})$", r"\1:\2", regex=True)


def _ns(stamps: pd.Series) -> np.ndarray:
    """Times as nanoseconds since the epoch, in UTC."""
    utc = pd.to_datetime(stamps, utc=True).dt.tz_localize(None)
    return utc.to_numpy().astype("datetime64[ns]").astype(np.int64)


def _stretches(times: np.ndarray, max_gap: int) -> list[tuple[int, int]]:
    """A series' rows between its gaps: differences over ``max_gap``."""
    cuts = (np.flatnonzero(np.diff(times) > max_gap) + 1).tolist()
    return list(itertools.pairwise([0, *cuts, len(times)]))


def _expected(frame: pd.DataFrame, series: str, time: str, column: str, spec: wk.WindowSpec,
              lo: object = None, hi: object = None, max_gap: int | None = None) -> np.ndarray:
    """The oracle: each series' windows (series in order of first row) lying in
    its rows with ``lo <= time < hi`` and spanning no gap over ``max_gap`` ns."""
    pieces = []
    for _, group in frame.groupby(series, sort=False):
        stamps = pd.to_datetime(group[time], utc=True)
        inside = np.ones(len(group), bool)
        if lo is not None:
            inside &= (stamps >= pd.Timestamp(lo, tz="UTC")).to_numpy()
        if hi is not None:
            inside &= (stamps < pd.Timestamp(hi, tz="UTC")).to_numpy()
        rows = np.flatnonzero(inside)
        times = _ns(group[time])
        gap = max_gap if max_gap is not None else int(np.diff(times).max())
        stretches = [(max(a, rows[0]), min(b, rows[-1] + 1))
                     for a, b in _stretches(times, gap)] if len(rows) else []
        values = group[[column]].to_numpy()
        pieces.append(oracle_windows_within(values, spec, stretches))
    return np.concatenate(pieces)


def _windows(store: wk.Store, split: str = "train") -> np.ndarray:
    got = store.windows(split, np.arange(store.num_windows(split)))
    return got[0] if isinstance(got, tuple) else got


def _cli(tmp_path: Path, source: Path, *options: str) -> Result:
    return CliRunner().invoke(main, ["convert", str(source), "--format", "zarr", "--out",
                                     str(tmp_path / "s"), "-q", *options])


# -- 1. split points in the time column's own kind -------------------------------------


def test_split_at_years_on_a_date_column_cut_at_each_years_first_day(tmp_path: Path) -> None:
    """The CLI help's own example: years on a column of dates are 1 January."""
    frame = _markets()
    frame.assign(date=frame["date"].dt.strftime("%Y-%m-%d")).to_csv(
        tmp_path / "markets_long.csv", index=False)
    result = _cli(tmp_path, tmp_path / "markets_long.csv", "--series-col", "index",
                  "--time-col", "date", "--columns", "close", "--window", "10",
                  "--max-gap", "3D", "--split-at", "1995,2000")
    assert result.exit_code == 0, result.output
    assert "holds no windows" not in result.output
    store = wk.open_store(tmp_path / "s")
    for split, lo, hi in (("train", None, "1995-01-01"), ("val", "1995-01-01", "2000-01-01"),
                          ("test", "2000-01-01", None)):
        expected = _expected(frame, "index", "date", "close", SPEC, lo, hi, 3 * 86400 * 10**9)
        rows = frame[(frame["date"] >= (lo or "1900")) & (frame["date"] < (hi or "2100"))]
        assert len(expected) == 2 * (len(rows) // 2 - 9)  # every window of the split's rows
        np.testing.assert_array_equal(_windows(store, split), expected.astype(np.float64))
    first = store.info["splits"]["val"]["first_time"]  # in days: 1995's first business day
    assert first == (pd.Timestamp("1995-01-02") - pd.Timestamp(0)).days


def test_split_at_iso_times_with_utc_offsets_on_timestamps(tmp_path: Path) -> None:
    """Timestamps written with offsets, split at a time with an offset and at a
    UTC date: cut where pandas compares them, with no warning on the way."""
    frame = _meters()
    text = frame.assign(time=_offset_text(frame["time"]))
    text.to_csv(tmp_path / "meters.csv", index=False)
    points = ["2021-03-28T12:00+02:00", "2021-03-29"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        store = wk.convert(tmp_path / "meters.csv", tmp_path / "s", window=SPEC,
                           series_col="meter", time_col="time", columns="kwh",
                           max_gap="1h", split_at=points)
    bounds = [None, *points, None]
    for split, lo, hi in zip(("train", "val", "test"), bounds, bounds[1:], strict=False):
        expected = _expected(frame, "meter", "time", "kwh", SPEC, lo, hi, 3600 * 10**9)
        assert len(expected) >= 2 * 47  # val: 14 hours of each meter
        np.testing.assert_array_equal(_windows(store, split), expected)


def test_integer_years_stay_integers(tmp_path: Path) -> None:
    """The Grunfeld panel's integer years: 1940 is the year 1940, not a day."""
    frame = pd.read_csv(REAL / "grunfeld.csv")
    store = wk.convert(REAL / "grunfeld.csv", tmp_path / "s", window=3, series_col="firm",
                       time_col="year", columns="invest", split_at=[1940, 1948])
    for split, lo, hi in (("train", 0, 1940), ("val", 1940, 1948), ("test", 1948, 9999)):
        rows = frame[(frame["year"] >= lo) & (frame["year"] < hi)]
        per_firm = rows.groupby("firm").size()
        assert store.num_windows(split) == int((per_firm - 2).clip(lower=0).sum())
    with pytest.raises(wk.InvalidSpecError, match=r"split point '1940-01-01' is not a time "
                       r"of the time column: it holds plain numbers"):
        wk.convert(REAL / "grunfeld.csv", tmp_path / "t", window=3, series_col="firm",
                   time_col="year", columns="invest", split_at="1940-01-01")
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize(("options", "needles"), [
    (["--split-at", "2015-02-06"], ["split points in time need a time column", "--time-col",
                                    "dates"]),
    (["--time-col", "date", "--split-at", "2000-01-01,1999-01-01"],
     ["split points must increase", "'1999-01-01' after '2000-01-01'"]),
    (["--time-col", "date", "--split-at", "1995,1995"], ["split points must increase"]),
    (["--time-col", "date", "--split-at", "02/06/2015"],
     ["split point '02/06/2015' is not a time", "2015-02-06"]),
    (["--max-gap", "5D"], ["--max-gap needs a time column", "--time-col"]),
    (["--time-col", "date", "--max-gap", "3"], ["max gap '3' has no unit", "dates", "'3D'"]),
])
def test_time_options_out_of_place_are_one_line(tmp_path: Path, options: list[str],
                                                needles: list[str]) -> None:
    frame = _markets()
    frame.to_csv(tmp_path / "markets_long.csv", index=False)
    result = _cli(tmp_path, tmp_path / "markets_long.csv", "--series-col", "index",
                  "--columns", "close", "--window", "10", *options)
    assert_one_line_error(result, *needles)
    assert not (tmp_path / "s").exists()


def test_python_errors_name_the_arguments(tmp_path: Path) -> None:
    frame = _markets()
    with pytest.raises(wk.InvalidSpecError, match=r"split_at cuts at .* time_col names"):
        wk.convert(frame, tmp_path / "s", window=SPEC, series_col="index", columns="close",
                   split_at="2015-02-06")
    with pytest.raises(wk.InvalidSpecError, match=r"^max_gap needs a time column"):
        wk.convert(frame, tmp_path / "s", window=SPEC, series_col="index", columns="close",
                   max_gap="5D")
    assert not (tmp_path / "s").exists()


def test_inspect_shows_times_at_the_resolution_the_data_has(tmp_path: Path) -> None:
    """100 Hz data split at 00:20:21.5: val starts there, train ends 10 ms
    before, in the text and the JSON alike (never rounded to whole seconds)."""
    stamps = pd.date_range("2009-08-24T00:20:00", periods=3000, freq="10ms")
    frame = pd.DataFrame({"time": stamps, "z": np.random.default_rng(1).normal(size=3000)})
    store = wk.convert(frame, tmp_path / "s", format="zarr", window=SPEC, time_col="time",
                       split_at="2009-08-24T00:20:21.5", split_context="history")
    result = CliRunner().invoke(main, ["inspect", str(store.path), "--json"])
    times = json.loads(result.output)["split_times"]
    assert times["val"][0] == "2009-08-24T00:20:21.500Z"
    assert times["train"][1] == "2009-08-24T00:20:21.490Z"
    text = CliRunner().invoke(main, ["inspect", str(store.path)]).output
    assert "00:20:21.500Z" in text and "00:20:21.490Z" in text


@pytest.mark.parametrize("suffix", ["csv", "parquet"])
def test_time_format_is_applied_to_the_text_as_written(tmp_path: Path, suffix: str) -> None:
    """A CSV's dates that pyarrow would parse itself are read with the given
    --time-format, as the same text in a Parquet file is: applied when it
    matches (1967-07-01 read '%Y-%d-%m' is 7 January), one line naming the
    row when it does not; a time column that is not text is one line."""
    frame = pd.DataFrame({"date": ["1967-07-01", "1967-08-01", "1967-09-01", "1967-10-31"],
                          "v": [1.0, 2.0, 3.0, 4.0]})
    source = tmp_path / f"econ.{suffix}"
    getattr(frame, "to_csv" if suffix == "csv" else "to_parquet")(source, index=False)
    result = _cli(tmp_path, source, "--time-col", "date", "--columns", "v", "--window", "2",
                  "--time-format", "%Y-%d-%m")
    assert_one_line_error(result, "row 3", "'1967-10-31' does not match --time-format")
    head = frame.iloc[:3]
    getattr(head, "to_csv" if suffix == "csv" else "to_parquet")(source, index=False)
    result = _cli(tmp_path, source, "--time-col", "date", "--columns", "v", "--window", "2",
                  "--time-format", "%Y-%d-%m")
    assert result.exit_code == 0, result.output
    summary = json.loads(CliRunner().invoke(main, ["inspect", str(tmp_path / "s"),
                                                   "--json"]).output)
    assert summary["split_times"]["train"][0] == "1967-01-07"
    typed = frame.assign(date=pd.to_datetime(frame["date"]))
    typed.to_parquet(tmp_path / "typed.parquet")
    result = _cli(tmp_path, tmp_path / "typed.parquet", "--time-col", "date", "--columns",
                  "v", "--window", "2", "--time-format", "%Y-%m-%d", "--overwrite")
    assert_one_line_error(result, "--time-format '%Y-%m-%d' reads text times", "timestamp")


# -- 2. --max-gap on timestamps: a unit, never nanoseconds ------------------------------


def test_a_bare_max_gap_on_timestamps_is_refused_with_the_units(tmp_path: Path) -> None:
    frame = _meters()
    frame.assign(time=_offset_text(frame["time"])).to_csv(tmp_path / "meters.csv", index=False)
    result = _cli(tmp_path, tmp_path / "meters.csv", "--series-col", "meter", "--time-col",
                  "time", "--columns", "kwh", "--window", "10", "--max-gap", "960")
    assert_one_line_error(result, "max gap '960' has no unit", "timestamps", "'960s'",
                          "'16min'", "'1h'")
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize(("max_gap", "gap_ns"), [("960s", 960 * 10**9), ("30min", 1800 * 10**9),
                                                 ("1h", 3600 * 10**9)])
def test_max_gap_with_a_unit_keeps_the_windows_within_it(tmp_path: Path, max_gap: str,
                                                         gap_ns: int) -> None:
    """The 45-minute outage is a gap under 960s and 30min, not under 1h."""
    frame = _meters()
    frame.assign(time=_offset_text(frame["time"])).to_csv(tmp_path / "meters.csv", index=False)
    result = _cli(tmp_path, tmp_path / "meters.csv", "--series-col", "meter", "--time-col",
                  "time", "--columns", "kwh", "--window", "10", "--max-gap", max_gap)
    assert result.exit_code == 0, result.output
    expected = _expected(frame, "meter", "time", "kwh", SPEC, max_gap=gap_ns)
    outage = 9 if gap_ns < 3600 * 10**9 else 0  # m2's windows across its hour from 99 to 100
    assert len(expected) == len(frame) - 2 * 9 - outage
    np.testing.assert_array_equal(_windows(wk.open_store(tmp_path / "s")), expected)


@pytest.mark.parametrize("max_gap", [pd.Timedelta("30min"), datetime.timedelta(minutes=30),
                                     np.timedelta64(30, "m"), "30min"],
                         ids=["pd.Timedelta", "datetime.timedelta", "np.timedelta64", "text"])
def test_max_gap_takes_every_kind_of_duration(tmp_path: Path, max_gap: object) -> None:
    frame = _meters()
    store = wk.convert(frame, tmp_path / "s", format="zarr", window=SPEC, series_col="meter",
                       time_col="time", columns=["kwh"], max_gap=max_gap)
    expected = _expected(frame, "meter", "time", "kwh", SPEC, max_gap=1800 * 10**9)
    np.testing.assert_array_equal(_windows(store), expected)


# -- 3. ISO text times from every table source --------------------------------------------


def _hourly() -> pd.DataFrame:
    """A sensor log with text times (2001-01-01T01:00) and a missing hour."""
    stamps = pd.date_range("2001-01-01", periods=200, freq="h").delete(50)
    rng = np.random.default_rng(5)
    return pd.DataFrame({"time": stamps.strftime("%Y-%m-%dT%H:%M"),
                         "temp": rng.normal(10, 3, len(stamps))})


@pytest.mark.parametrize("source", ["csv", "parquet", "frame"])
def test_iso_text_times_from_every_table_source(tmp_path: Path, source: str) -> None:
    frame = _hourly()
    frame.to_csv(tmp_path / "log.csv", index=False)
    frame.to_parquet(tmp_path / "log.parquet", index=False)
    given = {"csv": tmp_path / "log.csv", "parquet": tmp_path / "log.parquet",
             "frame": frame}[source]
    store = wk.convert(given, tmp_path / "s", window=SPEC, time_col="time",
                       split_at="2001-01-05")
    assert store.manifest.series.time_unit == "ns"
    frame["id"] = "log"
    for split, lo, hi in (("train", None, "2001-01-05"), ("val", "2001-01-05", None)):
        expected = _expected(frame, "id", "time", "temp", SPEC, lo, hi, 5400 * 10**9)
        assert len(expected) > 40
        np.testing.assert_array_equal(_windows(store, split), expected)


@pytest.mark.parametrize("source", ["csv", "parquet", "frame"])
def test_text_months_are_dates(tmp_path: Path, source: str) -> None:
    """Monthly passengers of two airlines, months written 1949-01: months of
    28 to 31 days are no gap, and a year splits at its January."""
    months = pd.period_range("1949-01", "1960-12", freq="M").strftime("%Y-%m")
    rng = np.random.default_rng(9)
    frame = pd.DataFrame({"airline": np.repeat(["A", "B"], len(months)),
                          "month": np.tile(months, 2),
                          "passengers": rng.integers(100, 600, 2 * len(months)).astype(float)})
    frame.to_csv(tmp_path / "air.csv", index=False)
    frame.to_parquet(tmp_path / "air.parquet", index=False)
    given = {"csv": tmp_path / "air.csv", "parquet": tmp_path / "air.parquet",
             "frame": frame}[source]
    store = wk.convert(given, tmp_path / "s", window=12, series_col="airline",
                       time_col="month", split_at="1958")
    assert store.manifest.series.time_unit == "days"
    assert store.num_windows("train") == 2 * (9 * 12 - 11)
    assert store.num_windows("val") == 2 * (3 * 12 - 11)
    expected = _expected(frame, "airline", "month", "passengers", wk.WindowSpec(12),
                         "1958-01-01", None, 31 * 86400 * 10**9)
    np.testing.assert_array_equal(_windows(store, "val"), expected)


def test_text_that_is_not_iso_still_asks_for_its_format(tmp_path: Path) -> None:
    frame = _hourly()
    frame.loc[120, "time"] = "06.01.2001 00:00"
    frame.to_parquet(tmp_path / "log.parquet", index=False)
    with pytest.raises(wk.SourceError, match=r"row 120, time '06.01.2001 00:00' is not an "
                       r"ISO date or time.*time_format"):
        wk.convert(tmp_path / "log.parquet", tmp_path / "s", window=SPEC, time_col="time")
    assert not (tmp_path / "s").exists()


# -- 4. a DataFrame's index as its time ---------------------------------------------------


def _daily_weather() -> pd.DataFrame:
    """Daily temperatures indexed by a DatetimeIndex named 'date', a day missing."""
    days = pd.date_range("2012-01-01", "2012-12-31", freq="D").delete(100)
    rng = np.random.default_rng(2)
    return pd.DataFrame({"temp_max": rng.normal(15, 6, len(days)),
                         "temp_min": rng.normal(5, 4, len(days))},
                        index=pd.DatetimeIndex(days, name="date"))


def test_a_named_datetime_index_is_the_time_column(tmp_path: Path) -> None:
    weather = _daily_weather()
    store = wk.convert(weather, tmp_path / "s", window=SPEC, time_col="date")
    flat = weather.reset_index()
    x = _windows(store)
    expected = oracle_windows_within(flat[["temp_max", "temp_min"]].to_numpy(), SPEC,
                                     _stretches(_ns(flat["date"]), 86400 * 10**9))
    assert len(x) == len(weather) - 9 - 9  # the missing day cuts 9 windows
    np.testing.assert_array_equal(x, expected)
    assert store.manifest.series.time_unit == "ns"


def test_a_multiindex_panel_names_its_series_and_time_levels(tmp_path: Path) -> None:
    frame = _markets()
    panel = frame.set_index(["index", "date"])
    store = wk.convert(panel, tmp_path / "s", window=SPEC, series_col="index",
                       time_col="date", max_gap="3D", split_at="2001")
    for split, lo, hi in (("train", None, "2001-01-01"), ("val", "2001-01-01", None)):
        expected = _expected(frame, "index", "date", "close", SPEC, lo, hi, 3 * 86400 * 10**9)
        np.testing.assert_array_equal(_windows(store, split), expected)


@pytest.mark.parametrize(("frame", "needles"), [
    (_daily_weather(), ["no time column 'time'", "columns: temp_max, temp_min",
                        "index: 'date'"]),
    (_daily_weather().rename_axis(None), ["no time column 'time'", "unnamed DatetimeIndex",
                                          "frame.index.name = 'time'"]),
])
def test_a_time_column_not_found_says_where_it_looked(tmp_path: Path, frame: pd.DataFrame,
                                                      needles: list[str]) -> None:
    with pytest.raises(wk.SourceError) as caught:
        wk.convert(frame, tmp_path / "s", window=SPEC, time_col="time")
    message = str(caught.value)
    assert "\n" not in message and all(n in message for n in needles), message
    assert not (tmp_path / "s").exists()
