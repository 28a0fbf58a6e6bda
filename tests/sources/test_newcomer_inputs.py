"""What a newcomer passes (issue 29): pandas Series, a string for a list of
columns, float years, the window as keywords, checked argument types, errors
naming Python arguments in Python and flags on the command line; and on the
command line several tables in one conversion (files, globs, a directory of
Parquet parts, hive partitions) and ``--dtype``. Windows are compared with the
NumPy oracle of ``tests/conftest.py``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from click.testing import CliRunner, Result

import windowkit as wk
from tests.conftest import oracle_windows
from windowkit.cli import main

SPEC = wk.WindowSpec(length=4, stride=2, horizon=1)


def _windows(store: wk.Store) -> tuple[np.ndarray, np.ndarray | None]:
    got = store.windows("train", np.arange(store.num_windows("train")))
    return got if isinstance(got, tuple) else (got, None)


def _assert_oracle(store: wk.Store, series: list[np.ndarray], spec: wk.WindowSpec) -> None:
    x, y = _windows(store)
    ex, ey = oracle_windows(series, spec)
    np.testing.assert_array_equal(x, ex)
    if ey is not None:
        np.testing.assert_array_equal(y, ey)


def _keys(store: wk.Store) -> list[str]:
    return store.series_table.column("key").to_pylist()


def _cli(*args: object) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def _sunspots() -> pd.DataFrame:
    """Years as floats (1700.0, ...), as statsmodels and many CSV exports write them."""
    rng = np.random.default_rng(29)
    return pd.DataFrame({"YEAR": np.arange(1700, 1760, dtype=np.float64),
                         "SUNACTIVITY": rng.uniform(0, 150, 60),
                         "OTHER": rng.normal(size=60)})


# -- deliverable 4: Python inputs ----------------------------------------------------

def test_a_pandas_series_is_one_series_named_by_its_name(tmp_path: Path,
                                                         concept_format: str) -> None:
    frame = _sunspots()
    series = frame["SUNACTIVITY"]
    store = wk.convert(series, tmp_path / "s", format=concept_format, window=SPEC)
    assert _keys(store) == ["SUNACTIVITY"] and store.step_shape == ()
    _assert_oracle(store, [series.to_numpy()], SPEC)
    x, _ = _windows(store)
    assert x.shape == (store.num_windows("train"), 4)  # scalar steps: x is [B, L]
    named = [frame["SUNACTIVITY"], frame["OTHER"]]  # a list of named Series keeps the names
    store = wk.convert(named, tmp_path / "two", format=concept_format, window=SPEC)
    assert _keys(store) == ["SUNACTIVITY", "OTHER"]
    _assert_oracle(store, [s.to_numpy() for s in named], SPEC)


def test_a_series_without_a_name_or_with_missing_values(tmp_path: Path) -> None:
    values = pd.Series([1.0, 2.0, None, 4.0, 5.0, 6.0, 7.0, 8.0], dtype="Float64")
    store = wk.convert(values, tmp_path / "s", window=2, nan="skip")
    assert _keys(store) == ["0"] and store.dtype == np.float64
    assert store.num_windows("train") == 5  # the 2 windows touching row 2 are left out


def test_a_string_is_one_column_wherever_columns_are_taken(tmp_path: Path) -> None:
    frame = _sunspots().assign(id="sun", size=3.0)
    store = wk.convert(frame, tmp_path / "s", format="zarr", window=SPEC,
                       columns="SUNACTIVITY", time_col="YEAR")
    assert store.manifest.columns == ["SUNACTIVITY"]
    _assert_oracle(store, [frame[["SUNACTIVITY"]].to_numpy()], SPEC)
    store = wk.convert(frame, tmp_path / "t", format="zarr", window=SPEC,
                       columns=["SUNACTIVITY", "OTHER"], target_columns="OTHER",
                       known_columns="SUNACTIVITY", static_columns="size",
                       series_col=["id"], time_col=["YEAR"])
    assert store.manifest.target_columns == ["OTHER"]
    assert store.manifest.known_columns == ["SUNACTIVITY"]
    assert store.manifest.static_columns == ["size"] and _keys(store) == ["sun"]
    with pytest.raises(wk.InvalidSpecError, match=r"^time_col takes one column name, got "
                                                  r"\['YEAR', 'id'\]$"):
        wk.convert(frame, tmp_path / "u", window=SPEC, time_col=["YEAR", "id"])


def test_float_years_are_integers(tmp_path: Path, concept_format: str) -> None:
    frame = _sunspots().drop(index=[30])  # 1730 missing: a gap no window spans
    store = wk.convert(frame, tmp_path / "s", format=concept_format, window=SPEC, time_col="YEAR",
                       columns="SUNACTIVITY", split_at=[1745])
    values = frame["SUNACTIVITY"].to_numpy()[:, None]
    x, _ = store.windows("train", np.arange(store.num_windows("train")))
    # rows 0..29 (1700..1729) before the gap, rows 30..44 (1731..1744) before the cut
    starts = [r for r in range(0, len(values), 2) if r + 5 <= 30 or 30 <= r <= 44 - 5]
    np.testing.assert_array_equal(x, np.stack([values[r:r + 4] for r in starts]))
    table = store.series_table
    assert table.column("first_time").to_pylist() == [1700]


@pytest.mark.parametrize(("year", "shown"), [(1701.5, "1701.5"), (1e20, "1e+20")])
def test_a_time_column_of_fractions_is_refused_naming_it(tmp_path: Path, year: float,
                                                         shown: str) -> None:
    frame = _sunspots()
    frame.loc[1, "YEAR"] = year
    with pytest.raises(wk.SourceError) as caught:
        wk.convert(frame, tmp_path / "s", window=SPEC, time_col="YEAR")
    message = str(caught.value)
    assert message.startswith(f"DataFrame: row 1, time column 'YEAR' holds {shown}, not a "
                              "whole number")
    assert "astype('int64')" in message and "\n" not in message
    assert not (tmp_path / "s").exists()


def test_the_window_as_keywords(tmp_path: Path, concept_format: str) -> None:
    values = np.random.default_rng(1).normal(size=(50, 3))
    store = wk.convert([values], tmp_path / "s", format=concept_format, window=5, stride=2,
                       sampling_rate=2, horizon=3)
    spec = wk.WindowSpec(5, stride=2, sampling_rate=2, horizon=3)
    assert store.spec == spec
    _assert_oracle(store, [values], spec)
    old = wk.convert([values], tmp_path / "old", format=concept_format, window=spec)  # still works
    assert old.spec == spec and old.num_windows("train") == store.num_windows("train")


@pytest.mark.parametrize(("arguments", "message"), [
    ({"window": wk.WindowSpec(4), "horizon": 3},
     "window is a WindowSpec and horizon is given too; give the window once"),
    ({"window": 4, "stride": 0}, "stride must be an integer >= 1, got 0"),
    ({"window": 4.0}, "window must be an integer >= 1, got 4.0"),
    ({"window": 4, "overwrite": "yes"}, "overwrite must be True or False, got 'yes' (str)"),
    ({"window": 4, "workers": "2"}, "workers must be an integer, got '2' (str)"),
    ({"window": 4, "columns": [1.5]}, "columns must name columns"),
    ({"window": 4, "nan": True}, "nan must be 'error' or 'skip', got True (bool)"),
    ({"window": 4, "dtype": "text"}, "dtype must be a float or integer dtype"),
    ({"window": 4, "dtype": "float32"}, "dtype apply to table sources"),
    ({"window": 4, "seed": -1}, "seed must be an integer >= 0, got -1"),
])
def test_arguments_are_checked_naming_them(tmp_path: Path, arguments: dict[str, object],
                                           message: str) -> None:
    with pytest.raises(wk.InvalidSpecError) as caught:
        wk.convert([np.zeros((20, 2))], tmp_path / "s", **arguments)  # type: ignore[arg-type]
    assert message in str(caught.value)
    assert "--" not in str(caught.value)
    assert not (tmp_path / "s").exists()


def test_python_errors_name_arguments_and_the_cli_its_flags(tmp_path: Path) -> None:
    values = np.ones((20, 2))
    values[5, 1] = np.nan
    with pytest.raises(wk.SourceError, match=r'\(nan="skip" keeps the rows') as caught:
        wk.convert([values], tmp_path / "s", window=4)
    assert "--" not in str(caught.value)
    np.save(tmp_path / "a.npy", values)
    result = _cli("convert", tmp_path / "a.npy", "--format", "zarr", "--out", tmp_path / "c",
                  "--window", 4)
    assert result.exit_code == 2 and "(--nan skip keeps the rows" in result.output
    frame = pd.DataFrame({"id": ["a"] * 6, "v": [1, 2, 3, None, 5, 6]})
    with pytest.raises(wk.SourceError, match=r'nan="skip" needs float feature columns'):
        wk.convert(frame, tmp_path / "s", window=2, series_col="id", nan="skip",
                   dtype="int32")
    with pytest.raises(wk.SourceError, match=r"with columns$"):
        wk.convert(frame.assign(t="x"), tmp_path / "s", window=2, series_col="id")


def test_a_bare_array_is_one_series_of_its_steps(tmp_path: Path) -> None:
    frames = np.random.default_rng(2).normal(size=(40, 6, 10)).astype(np.float32)
    store = wk.convert(frames, tmp_path / "one", window=4)
    assert store.manifest.series.count == 1 and store.step_shape == (6, 10)
    _assert_oracle(store, [frames], wk.WindowSpec(4))
    many = wk.convert(list(frames[:, :, :, None]), tmp_path / "many", window=4)  # 40 series
    assert many.manifest.series.count == 40 and many.step_shape == (10, 1)


def test_dtype_for_a_dataframe(tmp_path: Path) -> None:
    frame = _sunspots()
    store = wk.convert(frame, tmp_path / "s", window=SPEC, time_col="YEAR", dtype=np.float32)
    assert store.dtype == np.float32
    _assert_oracle(store, [frame[["SUNACTIVITY", "OTHER"]].to_numpy(np.float32)], SPEC)


# -- deliverable 5: several tables in one conversion, --dtype ------------------------

def _long_frame() -> pd.DataFrame:
    """Three sensors, 40 steps each, integer times; ``v`` float, ``n`` integer."""
    rng = np.random.default_rng(5)
    parts = [pd.DataFrame({"sensor": name, "t": np.arange(40), "v": rng.normal(size=40),
                           "n": rng.integers(0, 100, 40)}) for name in ("a", "b", "c")]
    return pd.concat(parts, ignore_index=True)


def _per_series(frame: pd.DataFrame, columns: list[str], dtype: object = None
                ) -> list[np.ndarray]:
    return [g[columns].to_numpy(dtype) for _, g in frame.groupby("sensor", sort=False)]


_LONG = ("--series-col", "sensor", "--time-col", "t", "--window", 4, "--stride", 2,
         "--horizon", 1, "-q")


def test_several_csv_files_are_one_table(tmp_path: Path, concept_format: str) -> None:
    frame = _long_frame()
    # sensor b's rows continue from the first file into the second
    frame.iloc[:60].to_csv(tmp_path / "part1.csv", index=False)
    frame.iloc[60:].to_csv(tmp_path / "part2.csv", index=False)
    result = _cli("convert", tmp_path / "part1.csv", tmp_path / "part2.csv", "--format",
                  concept_format,
                  "--out", tmp_path / "s", *_LONG)
    assert result.exit_code == 0, result.output
    store = wk.open_store(tmp_path / "s")
    assert _keys(store) == ["a", "b", "c"] and store.dtype == np.float64
    _assert_oracle(store, _per_series(frame, ["v", "n"], np.float64), SPEC)


def test_a_glob_of_parquet_files_with_float32(tmp_path: Path) -> None:
    frame = _long_frame()
    for k, (_, group) in enumerate(frame.groupby("sensor")):
        group.to_parquet(tmp_path / f"sensor-{k}.parquet", index=False)
    result = _cli("convert", tmp_path / "sensor-*.parquet", "--format", "zarr", "--out",
                  tmp_path / "s", "--dtype", "float32", *_LONG)
    assert result.exit_code == 0, result.output
    store = wk.open_store(tmp_path / "s")
    assert store.dtype == np.float32
    _assert_oracle(store, _per_series(frame, ["v", "n"], np.float32), SPEC)


def test_a_directory_of_parquet_parts_in_natural_order(tmp_path: Path, concept_format: str) -> None:
    """One wide series cut into 12 parts: part-10 and part-11 come after part-9."""
    rng = np.random.default_rng(6)
    wide = pd.DataFrame({"t": np.arange(240), "x": rng.normal(size=240),
                         "y": rng.normal(size=240)})
    ds.write_dataset(pa.Table.from_pandas(wide, preserve_index=False), tmp_path / "parts",
                     format="parquet", max_rows_per_file=20, max_rows_per_group=20,
                     use_threads=False)
    assert len(list((tmp_path / "parts").glob("part-*.parquet"))) == 12
    (tmp_path / "parts" / "_SUCCESS").write_text("")
    result = _cli("convert", tmp_path / "parts", "--format", concept_format, "--out",
                  tmp_path / "s",
                  "--time-col", "t", "--window", 4, "--stride", 2, "--horizon", 1,
                  "--sort-memory", "1KiB", "-q")  # streamed: no memory budget needed
    assert result.exit_code == 0, result.output
    store = wk.open_store(tmp_path / "s")
    assert _keys(store) == ["parts"]
    _assert_oracle(store, [wide[["x", "y"]].to_numpy()], SPEC)


def test_hive_partitions_become_columns(tmp_path: Path, concept_format: str) -> None:
    frame = _long_frame()
    ds.write_dataset(pa.Table.from_pandas(frame, preserve_index=False), tmp_path / "hive",
                     format="parquet", partitioning=["sensor"], partitioning_flavor="hive",
                     use_threads=False)
    assert (tmp_path / "hive" / "sensor=b").is_dir()
    result = _cli("convert", tmp_path / "hive", "--format", concept_format, "--out", tmp_path / "s",
                  "--columns", "v,n", *_LONG)
    assert result.exit_code == 0, result.output
    store = wk.open_store(tmp_path / "s")
    assert _keys(store) == ["a", "b", "c"]
    _assert_oracle(store, _per_series(frame, ["v", "n"], np.float64), SPEC)


def test_partitions_that_interleave_series_are_grouped(tmp_path: Path) -> None:
    """Partitioned by time: each sensor's rows are in every partition."""
    frame = _long_frame().assign(half=lambda f: f["t"] // 20)
    wk_frame = pa.Table.from_pandas(frame, preserve_index=False)
    ds.write_dataset(wk_frame, tmp_path / "byhalf", format="parquet", partitioning=["half"],
                     partitioning_flavor="hive", use_threads=False)
    store = wk.convert(tmp_path / "byhalf", tmp_path / "s", window=SPEC, series_col="sensor",
                       time_col="t", columns=["v", "n"])
    assert _keys(store) == ["a", "b", "c"]
    _assert_oracle(store, _per_series(frame, ["v", "n"], np.float64), SPEC)


def test_errors_in_several_files_name_the_file_and_its_row(tmp_path: Path) -> None:
    frame = _long_frame()
    frame.iloc[:60].to_csv(tmp_path / "p1.csv", index=False)
    late = frame.iloc[60:].copy()
    late.iloc[7, late.columns.get_loc("v")] = 1e300  # row 7 of p2.csv
    late.to_csv(tmp_path / "p2.csv", index=False)
    result = _cli("convert", tmp_path / "p*.csv", "--format", "zarr", "--out", tmp_path / "s",
                  "--dtype", "float32", *_LONG)
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert (f"{tmp_path / 'p2.csv'}: series 'b', row 7, column 'v': 1e+300 does not fit "
            "--dtype float32 (it overflows to infinity); choose a wider --dtype") in result.output
    assert not (tmp_path / "s").exists()
    late.iloc[7, late.columns.get_loc("v")] = None
    late.to_csv(tmp_path / "p2.csv", index=False)
    with pytest.raises(wk.SourceError, match=r"p2\.csv: series 'b', row 7, column 'v' is "
                                             r'missing .*nan="skip"'):
        wk.convert([tmp_path / "p1.csv", tmp_path / "p2.csv"], tmp_path / "s", window=SPEC,
                   series_col="sensor", time_col="t")


@pytest.mark.parametrize(("names", "message"), [
    (["a.npy", "t.csv"], "a.npy: a conversion takes .npy files or tables (CSV, Parquet), "
                         "not both"),
    (["t.csv", "t.parquet"], "t.csv: CSV and Parquet files cannot be mixed"),
    (["t.csv", "t.csv"], "t.csv: is given twice"),
])
def test_sources_that_do_not_mix(tmp_path: Path, names: list[str], message: str) -> None:
    frame = _long_frame()
    np.save(tmp_path / "a.npy", np.zeros((10, 2)))
    frame.to_csv(tmp_path / "t.csv", index=False)
    frame.to_parquet(tmp_path / "t.parquet", index=False)
    result = _cli("convert", *(tmp_path / n for n in names), "--format", "zarr", "--out",
                  tmp_path / "s", *_LONG)
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert message in result.output
    assert not (tmp_path / "s").exists()


def test_dtype_is_checked_on_the_command_line(tmp_path: Path) -> None:
    _long_frame().to_csv(tmp_path / "t.csv", index=False)
    result = _cli("convert", tmp_path / "t.csv", "--format", "zarr", "--out", tmp_path / "s",
                  "--dtype", "complex64", *_LONG)
    assert result.exit_code == 2 and "--dtype must be a float or integer dtype" in result.output
    result = _cli("convert", tmp_path / "t.csv", "--format", "zarr", "--out", tmp_path / "s",
                  "--dtype", "int8", *_LONG, "--columns", "n")
    assert result.exit_code == 0, result.output  # 0..99 fit int8
    store = wk.open_store(tmp_path / "s")
    assert store.dtype == np.int8


def test_table_options_are_named_by_flags_on_the_command_line(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.zeros((20, 2)))
    result = _cli("convert", tmp_path / "a.npy", "--format", "zarr", "--out", tmp_path / "s",
                  "--window", 4, "--dtype", "float32")
    assert result.exit_code == 2 and "--dtype apply to table sources" in result.output
    frame = _sunspots().assign(YEAR=lambda f: f["YEAR"] > 1720)
    with pytest.raises(wk.SourceError, match=r"^DataFrame: time column 'YEAR' has type bool; "
                                             r"expected integers, dates or timestamps"):
        wk.convert(frame, tmp_path / "t", window=4, time_col="YEAR")


# -- dtypes no format stores exactly: refused before anything is written ------------------------
@pytest.mark.parametrize("fmt", ["zarr", "parquet", "tfrecord"])
def test_a_longdouble_array_is_refused_before_anything_is_written(tmp_path: Path,
                                                                  fmt: str) -> None:
    with pytest.raises(wk.SourceError, match="dtype float128 is not supported") as caught:
        wk.convert([np.ones((50, 2), dtype=np.longdouble)], tmp_path / "s", format=fmt,
                   window=4)
    assert "\n" not in str(caught.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_longdouble_dataframe_column_is_one_line(tmp_path: Path) -> None:
    frame = pd.DataFrame({"a": np.ones(50, dtype=np.longdouble), "b": np.arange(50.0)})
    with pytest.raises(wk.SourceError, match="float128") as caught:
        wk.convert(frame, tmp_path / "s", format="parquet", window=4)
    assert "\n" not in str(caught.value) and not (tmp_path / "s").exists()


@pytest.mark.parametrize("fmt", ["zarr", "parquet", "tfrecord"])
def test_dtype_float128_on_the_command_line_is_one_line(tmp_path: Path, fmt: str) -> None:
    table = tmp_path / "t.csv"
    table.write_text("a,b\n" + "\n".join(f"{i},{i}" for i in range(50)))
    result = _cli("convert", table, "--format", fmt, "--out", tmp_path / "s", "--window", 4,
                  "--dtype", "float128", "-q")
    assert result.exit_code == 2 and "--dtype must be a float or integer dtype" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]


# -- a column given two roles ---------------------------------------------------------------------
def _chicks(tmp_path: Path) -> Path:
    """A long-form panel as exported: chick, time, weight."""
    frame = pd.DataFrame({"chick": np.repeat([1, 2, 3], 20), "time": np.tile(np.arange(20), 3),
                          "weight": np.arange(60.0)})
    frame.to_csv(tmp_path / "chicks.csv", index=False)
    return tmp_path / "chicks.csv"


@pytest.mark.parametrize(("flags", "roles"), [
    (["--series-col", "chick", "--columns", "weight,chick"], "the series column"),
    (["--series-col", "chick", "--time-col", "time", "--columns", "time,weight"],
     "the time column"),
    (["--series-col", "chick", "--time-col", "chick"], "the time column")],
    ids=["series and feature", "time and feature", "series and time"])
def test_a_column_given_two_roles_is_one_line_naming_both(tmp_path: Path, flags: list[str],
                                                          roles: str) -> None:
    result = _cli("convert", _chicks(tmp_path), "--format", "zarr", "--out", tmp_path / "s",
                  "--window", 4, *flags)
    assert result.exit_code == 2, result.output
    assert "is both" in result.output and roles in result.output, result.output
    assert not (tmp_path / "s").exists()
    frame = pd.read_csv(tmp_path / "chicks.csv")
    with pytest.raises(wk.SourceError, match="is both a feature column \\(columns\\) and the "
                       "series column \\(series_col\\)"):
        wk.convert(frame, tmp_path / "p", format="zarr", window=4, series_col="chick",
                   columns=["weight", "chick"])
