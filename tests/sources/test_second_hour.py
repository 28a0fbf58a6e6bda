"""A newcomer's second hour, in Python: a CSV without a header, a split left
without windows, a conversion run again over its finished store, the plot's
labels and bars, and TensorFlow's start-up lines under a log level the user set."""

from __future__ import annotations

import inspect
import logging
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import windowkit as wk

#: a heartpy PPG recording: one column of integers, no header line
PPG = np.random.default_rng(7).integers(400, 700, 2483)
TF_NOISE = ("oneDNN", "cuda", "cuInit", "absl", "cpu_feature_guard")


def _ppg(tmp_path: Path) -> Path:
    path = tmp_path / "ppg.csv"
    path.write_text("\n".join(str(v) for v in PPG) + "\n")
    return path


def test_a_csv_without_a_header_keeps_every_row(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the header is not said to look like data
        store = wk.convert(_ppg(tmp_path), tmp_path / "s", window=100, header=None)
    assert store.manifest.columns == ["0"] and store.manifest.total_rows == len(PPG)
    x = store.windows("train", slice(None))
    assert len(x) == len(PPG) - 99
    assert np.array_equal(x[:, :, 0], np.lib.stride_tricks.sliding_window_view(PPG, 100))


def test_several_csv_files_without_a_header(tmp_path: Path) -> None:
    rows = {"a": [[1, 10.5], [2, 11.5], [3, 12.5]], "b": [[4, 20.5], [5, 21.5], [6, 22.5]]}
    for name, values in rows.items():
        (tmp_path / f"{name}.csv").write_text("".join(f"{t},{v}\n" for t, v in values))
    store = wk.convert(str(tmp_path / "*.csv"), tmp_path / "s", window=2, header=None,
                       time_col="0", columns="1")
    assert store.manifest.columns == ["1"] and store.manifest.total_rows == 6
    x = store.windows("train", slice(None))
    assert np.array_equal(x[:, :, 0], [[10.5, 11.5], [11.5, 12.5], [12.5, 20.5],
                                       [20.5, 21.5], [21.5, 22.5]])


def test_a_header_of_numbers_is_said_to_look_like_data(tmp_path: Path) -> None:
    with pytest.warns(UserWarning) as caught:
        store = wk.convert(_ppg(tmp_path), tmp_path / "s", window=100)
    (warning,) = caught
    assert str(warning.message) == (
        f"{tmp_path / 'ppg.csv'}: the header looks like data ({PPG[0]}); pass header=None "
        "if the file has no header line (its first row is read as the column names)")
    assert warning.filename == __file__  # names the caller's line
    assert store.manifest.total_rows == len(PPG) - 1  # what it said: the first row is lost


def test_a_header_of_names_says_nothing(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text("pulse\n" + "\n".join(str(v) for v in PPG[:50]) + "\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        store = wk.convert(tmp_path / "t.csv", tmp_path / "s", window=10)
    assert store.manifest.columns == ["pulse"] and store.manifest.total_rows == 50


@pytest.mark.parametrize(("source", "header", "message"), [
    ("csv", 1, "header must be 0 (the first line names the columns) or None"),
    ("csv", True, "header must be 0"),
    ("parquet", None, "header=None applies to CSV files only"),
    ("array", None, "header=None applies to CSV files only"),
])
def test_header_is_checked(tmp_path: Path, source: str, header: Any, message: str) -> None:
    import pandas as pd

    given: Any = _ppg(tmp_path)
    if source == "parquet":
        given = tmp_path / "p.parquet"
        pd.DataFrame({"v": PPG}).to_parquet(given)
    elif source == "array":
        given = PPG.astype(float)
    with pytest.raises(wk.InvalidSpecError, match=re.escape(message)):
        wk.convert(given, tmp_path / "s", window=10, header=header)
    assert not (tmp_path / "s").exists()


def test_a_split_without_windows_is_a_user_warning(tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    series = [np.arange(20.0) + 100 * k for k in range(40)]
    with pytest.warns(UserWarning) as caught, caplog.at_level(logging.INFO, "windowkit"):
        store = wk.convert(series, tmp_path / "s", window=wk.WindowSpec(12),
                           splits={"train": .7, "val": .3})
    assert [str(w.message) for w in caught] == [
        "split 'val' holds no windows: each series' part of it is shorter than a window: "
        "at most 6 rows, a window spans 12 ((L+H-1)*R+1)"]
    assert caught[0].filename == __file__
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]  # said once
    assert store.num_windows("val") == 0 and store.num_windows("train") == 40 * 3


def test_the_same_conversion_again_has_nothing_to_do(tmp_path: Path) -> None:
    series = [np.arange(30.0).reshape(15, 2) + k for k in range(3)]
    out = tmp_path / "s"
    first = wk.convert(series, out, format="parquet", window=4)
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    again = wk.convert(series, out, format="parquet", window=4, workers=2)
    assert again.manifest.store_id == first.manifest.store_id
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before  # nothing written
    assert [p.name for p in tmp_path.iterdir()] == ["s"]  # no workspace left behind
    assert np.array_equal(again.windows("train", slice(None)),
                          first.windows("train", slice(None)))
    for changed in ({"window": 5}, {"window": 4, "splits": {"train": .5, "val": .5}}):
        with pytest.raises(wk.StoreExistsError, match="target exists and is not empty; "
                           "pass overwrite=True to replace it"):
            wk.convert(series, out, format="parquet", **changed)  # type: ignore[arg-type]
    with pytest.raises(wk.StoreExistsError, match="target exists and is not empty"):
        wk.convert([s + 1 for s in series], out, format="parquet", window=4)
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before


def test_a_rewritten_source_file_is_not_the_same_conversion(tmp_path: Path) -> None:
    path = _ppg(tmp_path)
    wk.convert(path, tmp_path / "s", window=10, header=None)
    wk.convert(path, tmp_path / "s", window=10, header=None)  # nothing to do
    path.write_text("\n".join(str(v) for v in PPG[::-1]) + "\n")
    with pytest.raises(wk.StoreExistsError, match="target exists and is not empty"):
        wk.convert(path, tmp_path / "s", window=10, header=None)


def test_the_plot_names_series_by_key_and_draws_visible_bars(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from windowkit.inspection import plot

    figures: list[Any] = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: figures.append(self))
    store = wk.convert({"JKSE": np.arange(500.0)}, tmp_path / "s", window=10)
    plot(store.path, tmp_path / "p.png")
    lengths, timeline, _ = figures[0].axes[:3]
    assert [t.get_text() for t in timeline.get_yticklabels()] == ["JKSE"]
    (bar,) = [p for p in lengths.patches if p.get_height() > 0]
    low, high = lengths.get_xlim()
    assert bar.get_height() == 1 and bar.get_width() >= 0.1 * (high - low)
    assert bar.get_x() <= 500 <= bar.get_x() + bar.get_width()


def test_series_and_time_columns_are_typed_as_one_name() -> None:
    hints = inspect.signature(wk.convert).parameters
    assert hints["series_col"].annotation == "str | None"
    assert hints["time_col"].annotation == "str | None"


TOUCH_TF = "import windowkit, tensorflow"


@pytest.mark.parametrize("level", ["1", "2", "3"])
def test_a_log_level_the_user_set_keeps_start_up_lines_away(level: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "WINDOWKIT_TF_LOG_LEVEL_DEFAULT"}
    done = subprocess.run([sys.executable, "-c", TOUCH_TF + "; import os; "
                           "print(os.environ['TF_CPP_MIN_LOG_LEVEL'])"],
                          capture_output=True, text=True, timeout=180,
                          env={**env, "TF_CPP_MIN_LOG_LEVEL": level})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == level  # the user's level is kept
    assert not [line for line in done.stderr.splitlines()
                if any(word in line for word in TF_NOISE)], done.stderr


def test_the_user_level_hides_only_what_is_below_it() -> None:
    """At level 1 TensorFlow's info lines are dropped, its warnings and errors kept."""
    code = r"""
import os
from windowkit._quiet import filtered_stderr
with filtered_stderr("I"):
    os.write(2, b"WARNING: All log messages before absl::InitializeLog() is called\n")
    os.write(2, b"I0000 00:00:1795548537.190555   26803 port.cc:153] oneDNN custom ops\n")
    os.write(2, b"W0000 00:00:1795548537.190555   26803 x.cc:1] a warning stays\n")
    os.write(2, b"E0000 00:00:1795548539.370577   26803 x.cc:2] an error stays\n")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        "W0000 00:00:1795548537.190555   26803 x.cc:1] a warning stays",
        "E0000 00:00:1795548539.370577   26803 x.cc:2] an error stays"]
