"""Wide tables: a header of 200,000 columns is checked in linear time, so that
``windowkit convert`` gives its one-line answer in seconds (it took minutes and
gigabytes when each column was counted against the whole header), and the
answer still names what is wrong (a duplicated column, a missing one)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from click.testing import CliRunner

import windowkit as wk
from tests.helpers import assert_one_line_error
from windowkit.cli import main
from windowkit.errors import SourceError
from windowkit.sources._datasets import csv_shape
from windowkit.sources._table_schema import TableOptions, read_schema

_WIDE = 200_000
_LOOSE_SECONDS = 30  # measured: about 5 s on two cores; loose for a loaded CI machine


def _wide_csv(path: Path, names: list[str], rows: int = 2) -> Path:
    with path.open("w") as fh:
        fh.write(",".join(names) + "\n")
        for row in range(rows):
            fh.write(",".join([str(row + 1)] * len(names)) + "\n")
    return path


def _convert(tmp_path: Path, source: Path, *extra: str) -> tuple[object, float]:
    started = time.perf_counter()
    result = CliRunner().invoke(main, ["convert", str(source), "--format", "zarr", "--out",
                                       str(tmp_path / "store"), "--window", "3", "-q", *extra])
    return result, time.perf_counter() - started


def test_a_200000_column_header_gets_its_answer_in_seconds(tmp_path: Path) -> None:
    source = _wide_csv(tmp_path / "wide.csv", [f"c{i}" for i in range(_WIDE)])
    result, seconds = _convert(tmp_path, source)
    assert_one_line_error(result, "no window fits", "longest: 2 rows")
    assert seconds < _LOOSE_SECONDS, seconds
    assert not (tmp_path / "store").exists()


def test_duplicates_in_a_200000_column_header_are_named(tmp_path: Path) -> None:
    names = [f"c{i}" if i % 1000 else "twice" for i in range(_WIDE)]
    source = _wide_csv(tmp_path / "dup.csv", names)
    result, seconds = _convert(tmp_path, source)
    assert_one_line_error(result, "dup.csv: column name 'twice' appears 200 times in the "
                          "header", "rename one")
    assert seconds < _LOOSE_SECONDS, seconds


def test_a_missing_column_of_a_wide_header_is_one_short_line(tmp_path: Path) -> None:
    source = _wide_csv(tmp_path / "wide.csv", [f"c{i}" for i in range(_WIDE)])
    result, seconds = _convert(tmp_path, source, "--series-col", "nope")
    assert_one_line_error(result, "no series column 'nope'", f"... ({_WIDE} in all)")
    assert len(result.output) < 1000, len(result.output)
    assert seconds < _LOOSE_SECONDS, seconds


def test_the_schema_check_is_linear() -> None:
    """A 200,000-column schema is checked in well under the minutes the quadratic
    count took for it."""
    names = [f"c{i}" for i in range(_WIDE)]
    schema = pa.schema([pa.field(n, pa.float32()) for n in names])
    started = time.perf_counter()
    columns = read_schema("t.parquet", TableOptions(), schema)
    assert time.perf_counter() - started < _LOOSE_SECONDS
    assert len(columns.features) == len(names) and columns.dtype == np.float32
    twice = pa.schema([*schema, pa.field("c7", pa.float32())])
    with pytest.raises(SourceError, match="column name 'c7' appears 2 times"):
        read_schema("t.parquet", TableOptions(), twice)


@pytest.mark.parametrize(("label", "options"), [
    ("--columns", TableOptions(columns=("a", "b", "a"))),
    ("--static-columns", TableOptions(series_col="id", static_columns=("s", "s"))),
])
def test_a_column_named_twice_in_the_options_is_named(label: str,
                                                      options: TableOptions) -> None:
    schema = pa.schema([("id", pa.string()), ("a", pa.float32()), ("b", pa.float32()),
                        ("s", pa.int32())])
    with pytest.raises(SourceError, match=f"{label} names '[as]' more than once"):
        read_schema("t.csv", options, schema)


def test_the_first_non_numeric_feature_is_named() -> None:
    schema = pa.schema([("a", pa.float32()), ("b", pa.string()), ("c", pa.float32()),
                        ("d", pa.binary())])
    with pytest.raises(SourceError, match=r"column 'b' is not numeric \(string\)"):
        read_schema("t.csv", TableOptions(), schema)


def _values(kind: str, rows: int, width: int) -> np.ndarray:
    values = np.arange(rows * width, dtype=np.float64).reshape(rows, width)
    if kind == "mixed":  # odd columns hold fractions: float64 there, int64 elsewhere
        values[:, 1::2] += 0.5
    elif kind == "float":  # every column float64
        values += 0.25
    return values


def _csv_lines(values: np.ndarray, kind: str) -> list[str]:
    cell = (lambda v: str(int(v))) if kind == "int" else repr
    return [",".join(f"c{i}" for i in range(values.shape[1])),
            *(",".join(cell(v) for v in row) for row in values.tolist())]


@pytest.mark.parametrize("kind", ["int", "mixed", "float"])
def test_wide_values_are_staged_exactly(tmp_path: Path, kind: str) -> None:
    """Many columns of one type are read in one step; the values are those read
    column by column, and mixed types still take that path."""
    values = _values(kind, rows=12, width=3000)
    lines = _csv_lines(values, kind)
    (tmp_path / "w.csv").write_text("\n".join(lines) + "\n")
    store = wk.convert(str(tmp_path / "w.csv"), tmp_path / "store", format="zarr",
                       window=wk.WindowSpec(12))
    assert store.dtype == (np.int64 if kind == "int" else np.float64)
    np.testing.assert_array_equal(np.asarray(store.windows("train", [0]))[0], values)


def test_an_empty_value_of_a_wide_table_is_named(tmp_path: Path) -> None:
    values = _values("float", rows=12, width=3000)
    lines = _csv_lines(values, "float")
    cells = lines[6].split(",")
    cells[1234] = ""
    lines[6] = ",".join(cells)
    (tmp_path / "w.csv").write_text("\n".join(lines) + "\n")
    result, _ = _convert(tmp_path, tmp_path / "w.csv")
    assert_one_line_error(result, "w.csv: row 5, column 'c1234' is missing")


def test_the_disk_estimate_of_a_csv_reads_its_bytes_only() -> None:
    """The estimate of what staging writes reads the first block's bytes: rows by
    line ends (scaled to the file's size), columns by the header, quotes and all."""
    header = b'a,"b,c","d\ne"\n'
    sample = header + b"1,2,3\n" * 9
    assert csv_shape(sample, len(sample)) == (12, 3)  # 11 line ends, + 1: an upper bound
    assert csv_shape(sample, 10 * len(sample))[0] == 111
    with pytest.raises(ValueError):
        csv_shape(b"", 0)
