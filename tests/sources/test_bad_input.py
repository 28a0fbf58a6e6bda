"""The bad-input catalogue: every user mistake, in every format, gives one clear
line naming what and where, exit status 2, no traceback, and writes nothing."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tests.helpers import long_csv, npy_file, text_file
from windowkit.cli import main


def _good(d: Path) -> Path:
    np.save(d / "good.npy", np.random.default_rng(0).normal(size=(200, 3)).astype(np.float32))
    return d / "good.npy"


def _with_value(value: float) -> Callable[[Path], Path]:
    def make(d: Path) -> Path:
        rows = np.zeros((100, 3), dtype=np.float32)
        rows[41, 2] = value
        np.save(d / "bad.npy", rows)
        return d / "bad.npy"
    return make


def _truncated(d: Path) -> Path:
    path = _good(d)
    os.truncate(path, path.stat().st_size - 100)
    return path


def _missing(d: Path) -> Path:
    return d / "missing.npy"


_GOOD_ROWS = [("a", t, "1.5") for t in range(12)] + [("b", t, "2.5") for t in range(12)]
_LONG = ["--series-col", "id", "--time-col", "t"]


def _nan_parquet(d: Path) -> Path:
    import pandas as pd

    frame = pd.DataFrame({"id": ["a"] * 12 + ["b"] * 12, "t": list(range(12)) * 2,
                          "v": np.arange(24.0)})
    frame.loc[15, "v"] = np.inf
    frame.to_parquet(d / "t.parquet")
    return d / "t.parquet"


def _corrupt_parquet(d: Path) -> Path:
    import pandas as pd

    pd.DataFrame({"v": np.arange(50.0)}).to_parquet(d / "bad.parquet")
    data = bytearray((d / "bad.parquet").read_bytes())
    data[len(data) // 2: len(data) // 2 + 40] = b"\x00" * 40
    (d / "bad.parquet").write_bytes(bytes(data[:-30]))
    return d / "bad.parquet"


CASES = [  # (make source, extra options, message)
    (_missing, [], "missing.npy: no such file"),
    (_good, ["--window", "0"], "window length must be an integer >= 1, got 0"),
    (_good, ["--stride", "0"], "stride must be an integer >= 1, got 0"),
    (_good, ["--sampling-rate", "0"], "sampling rate must be an integer >= 1, got 0"),
    (_good, ["--horizon", "-1"], "horizon must be an integer >= 0, got -1"),
    (_good, ["--format", "hdf5"], "Invalid value for '--format': 'hdf5' is not one of"),
    (npy_file("empty.npy", np.zeros((0, 3), np.float32)), [],
     "empty.npy: series is empty (0 rows)"),
    (npy_file("obj.npy", np.array([[1, "a"]], dtype=object)), [], "obj.npy: "),
    (npy_file("text.npy", np.array([["a", "b"]] * 50)), [], "text.npy: "),
    (npy_file("cplx.npy", np.ones((50, 2), np.complex64)), [], "cplx.npy: "),
    (_with_value(np.nan), [], "bad.npy: row 41, column 2 is nan"),
    (_with_value(np.inf), [], "bad.npy: row 41, column 2 is inf"),
    (_truncated, [], "good.npy: truncated or damaged .npy file"),
    (_good, ["--window", "300"], "longer than every series (longest: 200 rows)"),
    (_good, ["--out", None], "Missing option '--out'"),
    (_good, ["--split", "train=0.8,val"], "split 'train=0.8,val' does not parse"),
    (_good, ["--split", "train=0.8,val=0.3"], "split fractions sum to 1.1, over 1"),
    (_good, ["--split-at", "2020"], "split points in time need a time column"),
    # tables
    (text_file("t.csv", long_csv(_GOOD_ROWS)), ["--series-col", "nope"], "no series column 'nope'"),
    (text_file("t.csv", long_csv(_GOOD_ROWS)), ["--time-col", "when"], "no time column 'when'"),
    (text_file("t.csv", long_csv(_GOOD_ROWS)), [*_LONG, "--columns", "v,w"],
     "no feature column 'w'"),
    (text_file("t.csv", long_csv(_GOOD_ROWS[:12] + [("b", t, "x") for t in range(12)])), _LONG,
     "t.csv: column 'v' is not numeric"),
    (text_file("t.csv", long_csv(_GOOD_ROWS[:12] + [("b", t, "") for t in range(12)])), _LONG,
     "t.csv: series 'b', row 12, column 'v' is missing (empty or NaN)"),
    (text_file("t.csv", long_csv([*_GOOD_ROWS[:12], ("b", 0, "nan"), *_GOOD_ROWS[13:]])), _LONG,
     "t.csv: series 'b', row 12, column 'v' is missing (empty or NaN)"),
    (_nan_parquet, _LONG, "t.parquet: series 'b': row 3, column 'v' is inf"),
    (text_file("t.csv", long_csv([*_GOOD_ROWS[:5], ("a", 4, "1"), *_GOOD_ROWS[5:]])), _LONG,
     "t.csv: series 'a', row 5: time repeats the previous row's"),
    (text_file("t.csv", long_csv([*_GOOD_ROWS[:5], ("a", 2, "1"), *_GOOD_ROWS[5:]])), _LONG,
     "t.csv: series 'a', row 5: time goes back from the previous row's"),
    (text_file("t.csv", long_csv(_GOOD_ROWS[:6] + _GOOD_ROWS[12:] + _GOOD_ROWS[6:12])),
     [*_LONG, "--sort-memory", "100B"],
     "rows of series 'a' are not grouped together (it appears again at row 18); sort the "
     "table by 'id' and 't' first (the table is larger than the memory budget"),
    (text_file("t.csv", long_csv(_GOOD_ROWS) + "c,1,2.0,extra\n"), _LONG,
     "t.csv: cannot read the table"),
    (_corrupt_parquet, [], "bad.parquet: cannot read the table"),
    (text_file("t.csv", long_csv(_GOOD_ROWS)), [*_LONG, "--max-gap", "soon"],
     "max gap 'soon' is not a number or a duration"),
]


@pytest.mark.parametrize(("make", "options", "message"), CASES,
                         ids=[f"{i}-{c[2][:30]}" for i, c in enumerate(CASES)])
def test_bad_input_is_one_clear_line_and_writes_nothing(tmp_path: Path, concept_format: str,
                                                        make: Callable[[Path], Path],
                                                        options: list[str | None],
                                                        message: str) -> None:
    (tmp_path / "src").mkdir()
    source = make(tmp_path / "src")
    out = tmp_path / "out" / "store"
    args = {"--format": concept_format, "--out": str(out), "--window": "8"}
    extra = iter(options)
    for option in extra:
        args[str(option)] = next(extra)
    argv = ["convert", str(source)] + [
        item for key, value in args.items() if value is not None for item in (key, value)]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 2, result.output
    assert result.output.startswith("windowkit: error: ")
    assert result.output.count("\n") == 1 and "Traceback" not in result.output
    assert message in result.output, result.output
    assert not out.exists() and not out.parent.exists(), "something was written"


def test_an_existing_target_is_refused_and_kept(tmp_path: Path, concept_format: str) -> None:
    source = _good(tmp_path)
    out = tmp_path / "store"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    result = CliRunner().invoke(main, ["convert", str(source), "--format", concept_format, "--out",
                                       str(out), "--window", "8"])
    assert result.exit_code == 2 and result.output.count("\n") == 1
    assert "target exists and is not empty" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.npy", "store"]
    assert (out / "precious.txt").read_text() == "keep me"
