"""Empty is never silent: a conversion yielding no window is an error (nothing
published), a split without windows is one warning line saying why, reading one
is one clear error in both readers. ``inspect``'s split times are those of the
windows. TensorFlow's C++ start-up lines stay off stderr unless the user asked."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import windowkit as wk
from windowkit.inspection import describe, render

WINDOWKIT = str(Path(sys.executable).with_name("windowkit"))
NOISE = re.compile(r"oneDNN|cuda drivers|cuInit|absl|cpu_feature_guard|rebuild TensorFlow")


def _series(*lengths: int) -> list[np.ndarray]:
    return [np.arange(n * 2, dtype=np.float64).reshape(n, 2) + 1000 * k
            for k, n in enumerate(lengths)]


def _all_nan() -> list[np.ndarray]:
    return [np.full((30, 2), np.nan), np.full((12, 2), np.nan)]


def _nothing_left(directory: Path, *keep: str) -> None:
    """No store, no partial store, no lock beside the target."""
    assert sorted(p.name for p in directory.iterdir()) == sorted(keep)


EMPTY_CASES = {
    "too short": (lambda: _series(5, 6), dict(window=wk.WindowSpec(4, horizon=3)),
                  r"no window fits: a window spans 7 rows \(\(L\+H-1\)\*R\+1 .*longer than "
                  r"every series \(longest: 6 rows\)"),
    "split": (lambda: _series(20, 18), dict(window=wk.WindowSpec(8, horizon=4),
                                            splits={"train": .5, "val": .5}),
              r"no window fits in any split: a window spans 12 rows.*longest: train 10, val 10 "
              r"rows\); split_context=\"history\" would give the splits after training 13 "
              r"windows"),
    "all nan": (_all_nan, dict(window=wk.WindowSpec(4), nan="skip"),
                r"the conversion yields no window: all 36 windows that fit are left out: 36 "
                r"would touch a row with NaN"),
}


@pytest.mark.parametrize("case", list(EMPTY_CASES))
def test_a_conversion_without_windows_is_an_error(tmp_path: Path, concept_format: str,
                                                  case: str) -> None:
    make, options, message = EMPTY_CASES[case]
    with pytest.raises(wk.InvalidSpecError, match=message):
        wk.convert(make(), tmp_path / "store", format=concept_format, **options)  # type: ignore[arg-type]
    _nothing_left(tmp_path)


@pytest.mark.parametrize("rows, extra, message", [
    (5, [], "longer than every series (longest: 5 rows)"),
    (24, ["--split", "train=0.5,val=0.5"], "no window fits in any split"),
    (20, ["--nan", "skip", "--blank"], "would touch a row with NaN"),
])
def test_the_cli_refuses_a_table_without_windows(tmp_path: Path, rows: int, extra: list[str],
                                                 message: str) -> None:
    """A wide table (one series) with no window: one line, exit 2, nothing at --out."""
    blank = "--blank" in extra
    frame = pd.DataFrame({"year": np.arange(1960, 1960 + rows),
                          "a": np.r_[1.0, np.full(rows - 1, np.nan)] if blank
                          else np.arange(rows, dtype=float),
                          "b": np.arange(rows, dtype=float)})
    frame.to_csv(tmp_path / "wide.csv", index=False)
    done = subprocess.run([WINDOWKIT, "convert", str(tmp_path / "wide.csv"), "--format", "zarr",
                           "--out", str(tmp_path / "store"), "--time-col", "year", "--window",
                           "12", "--horizon", "1", *[e for e in extra if e != "--blank"]],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("windowkit: error: "), done.stderr
    assert message in lines[0]
    _nothing_left(tmp_path, "wide.csv")


def _warnings(caught: pytest.WarningsRecorder, caplog: pytest.LogCaptureFixture) -> list[str]:
    """What Python was told: UserWarnings (the package logger says nothing more)."""
    assert not [r for r in caplog.records if r.name == "windowkit"
                and r.levelno == logging.WARNING]
    return [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


def test_an_empty_split_is_one_warning_and_an_error_when_read(
        tmp_path: Path, concept_format: str, caplog: pytest.LogCaptureFixture) -> None:
    """70/30 of short series leaves val without a window: said once at conversion,
    with the history context's count; both readers refuse to read it."""
    out = tmp_path / "store"
    with pytest.warns(UserWarning) as caught, caplog.at_level(logging.WARNING, "windowkit"):
        store = wk.convert(_series(30, 25), out, format=concept_format, window=wk.WindowSpec(8,
                                                                                             horizon=2),
                           splits={"train": .7, "val": .3})
    (warning,) = _warnings(caught, caplog)
    assert warning == (
        "split 'val' holds no windows: each series' part of it is shorter than a "
        "window: at most 9 rows, a window spans 10 ((L+H-1)*R+1); split_context=\"history\" "
        "would give it 14 windows, their inputs reaching into the "
        "rows before the split")
    assert store.num_windows("val") == 0 and store.num_windows("train") > 0
    expected = re.escape(f"split 'val' of store {store.path} holds no windows")
    with pytest.raises(wk.InvalidSpecError, match=expected):
        store.tf_dataset("val", 4)
    with pytest.raises(wk.InvalidSpecError, match=expected):
        store.keras_dataset("val", 4)
    with pytest.raises(wk.InvalidSpecError, match=expected):
        store.tf_dataset("val", 4, shuffle="global")
    assert "windows [val]    0  (none: nothing to read)" in render(describe(out))
    history = wk.convert(_series(30, 25), tmp_path / "h", format=concept_format,
                         window=wk.WindowSpec(8, horizon=2), splits={"train": .7, "val": .3},
                         split_context="history")
    assert history.num_windows("val") == 14


@pytest.mark.parametrize("case", ["no horizon", "no series", "nan", "gap"])
def test_each_empty_split_says_why(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                   case: str) -> None:
    source: object = _series(30, 25)
    options: dict[str, object] = {"window": wk.WindowSpec(10),
                                  "splits": {"train": .7, "val": .3}}
    if case == "no series":
        options = {"window": wk.WindowSpec(4), "split_by": "series",
                   "splits": {"train": .6, "val": .2, "test": .2}}
    elif case == "nan":
        arrays = _series(60)
        arrays[0][[50, 53], 1] = np.nan  # every val window (starts 44, 48, 52), no train one
        source, options = arrays, {"window": wk.WindowSpec(8, stride=4), "nan": "skip",
                                   "splits": {"train": .7, "val": .3}}
    elif case == "gap":
        years = np.r_[np.arange(1900, 1950), np.arange(1960, 1969)]  # val: rows 44..58
        source = pd.DataFrame({"year": years, "v": np.arange(len(years), dtype=float)})
        options = {"window": wk.WindowSpec(10), "time_col": "year",
                   "splits": {"train": .75, "val": .25}}
    with pytest.warns(UserWarning) as caught, caplog.at_level(logging.WARNING, "windowkit"):
        wk.convert(source, tmp_path / "s", format="zarr", **options)  # type: ignore[arg-type]
    (warning,) = _warnings(caught, caplog)
    empty = "test" if case == "no series" else "val"
    assert f"split '{empty}' holds no windows: " in warning
    assert "history" not in warning  # the history context would not help here
    assert {"no horizon": "at most 9 rows, a window spans 10",
            "no series": "no series has a row in it",
            "nan": "all 3 windows that fit are left out: 3 would touch a row with NaN",
            "gap": "all 6 windows that fit are left out: 6 would span a time gap"}[case] in warning


def test_the_cli_warns_of_an_empty_split_even_when_quiet(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.zeros((30, 2)))
    done = subprocess.run([WINDOWKIT, "convert", str(tmp_path / "a.npy"), "--format", "zarr",
                           "--out", str(tmp_path / "s"), "--window", "8", "--horizon", "2",
                           "--split", "train=0.7,val=0.3", "--quiet"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        "windowkit: split 'val' holds no windows: each series' part of it is "
        "shorter than a window: at most 9 rows, a window spans 10 ((L+H-1)*R+1); "
        "--split-context history would give it 8 windows, their "
        "inputs reaching into the rows before the split"]


def test_no_window_on_dask_and_s3_publishes_nothing(tmp_path: Path, s3_bucket: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Refused before the parts (too short) and after them, on Dask workers (every
    window touches a NaN): no store at the URL, the same as a local conversion."""
    import fsspec

    distributed = pytest.importorskip("distributed")
    monkeypatch.setenv("WINDOWKIT_CACHE", str(tmp_path / "cache"))
    fs = fsspec.filesystem("s3")
    with pytest.raises(wk.InvalidSpecError, match="longer than every series"):
        wk.convert(_series(5), f"{s3_bucket}/short", format="parquet", window=wk.WindowSpec(8))
    with distributed.LocalCluster(n_workers=1, processes=False, dashboard_address=None) as c, \
            distributed.Client(c, set_as_default=False) as client, \
            pytest.raises(wk.InvalidSpecError, match="would touch a row with NaN"):
        wk.convert(_all_nan(), f"{s3_bucket}/nan", format="tfrecord", window=wk.WindowSpec(4),
                   nan="skip", dask=client)
    bucket = s3_bucket.removeprefix("s3://")
    fs.invalidate_cache()
    assert not [p for p in fs.find(bucket) if p.endswith("windowkit.json")]
    assert not fs.exists(f"{bucket}/short") and not fs.exists(f"{bucket}/nan")


# -- inspect's split times ---------------------------------------------------------------
@pytest.mark.parametrize("context", ["none", "history"])
def test_inspect_split_times_are_those_of_the_windows(tmp_path: Path, concept_format: str,
                                                      context: str) -> None:
    """Stride 2, a gap, a NaN and two series: each split's times run from the first
    row of its earliest window (its first target under the history context) to the
    last row of its latest, as the index entries and the source's times say."""
    years = {"a": np.r_[np.arange(1700, 1760), np.arange(1763, 1801)],
             "b": np.arange(1711, 1790)}
    frame = pd.concat([pd.DataFrame({"id": k, "year": t, "v": np.sin(t.astype(float))})
                       for k, t in years.items()], ignore_index=True)
    frame.loc[frame.index[-4], "v"] = np.nan  # series b, near its end
    spec = wk.WindowSpec(5, stride=2, horizon=2)
    store = wk.convert(frame, tmp_path / "s", format=concept_format, window=spec, series_col="id",
                       time_col="year", columns=["v"], splits={"train": .6, "val": .4},
                       split_context=context, nan="skip")
    times = [years[k] for k in store.series_table.column("key").to_pylist()]
    summary = describe(store.path)
    for split in ("train", "val"):
        index = store.index(split)
        skip = spec.length if context == "history" and split == "val" else 0  # its targets
        first = min(int(times[s][start + skip]) for s, start, _ in index)
        last = max(int(times[s][start + spec.span - 1]) for s, start, _ in index)
        assert summary["split_times"][split] == [first, last]
        label = "target times" if skip else "times"
        assert f"({label} {first}..{last})" in render(summary)
    # the split's last row (1800) is no window's: the old report said 1800
    assert summary["split_times"]["val"][1] == 1799


# -- TensorFlow's start-up lines ---------------------------------------------------------
def _environment(**values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("TF_CPP_MIN_LOG_LEVEL", "WINDOWKIT_TF_LOG_LEVEL_DEFAULT")}
    return {**env, **values}


TOUCH_TF = ("import sys, windowkit, tensorflow as tf; print('python line', file=sys.stderr); "
            "tf.constant([1.0]) + 1; import os; print(os.environ['TF_CPP_MIN_LOG_LEVEL'])")


def test_import_windowkit_keeps_tensorflow_quiet() -> None:
    done = subprocess.run([sys.executable, "-c", TOUCH_TF], capture_output=True, text=True,
                          env=_environment(), timeout=180)
    assert done.returncode == 0, done.stderr
    assert not NOISE.search(done.stderr), done.stderr
    assert "python line" in done.stderr  # stderr of its own is kept
    assert done.stdout.strip() == "3"


def test_a_log_level_the_user_set_is_kept() -> None:
    code = ("import os, sys, windowkit; from windowkit._quiet import _QuietFirstImport; "
            "print(os.environ['TF_CPP_MIN_LOG_LEVEL'], "
            "any(isinstance(f, _QuietFirstImport) for f in sys.meta_path))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=_environment(TF_CPP_MIN_LOG_LEVEL="0"), timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "False"]  # nothing filtered either


def test_the_cli_keeps_tensorflow_quiet(tmp_path: Path) -> None:
    """convert, inspect, verify and bench (which loads TensorFlow): no start-up line."""
    np.save(tmp_path / "a.npy", np.random.default_rng(0).normal(size=(3000, 2)))
    store = str(tmp_path / "s")
    commands = [["convert", str(tmp_path / "a.npy"), "--format", "tfrecord", "--out", store,
                 "--window", "4", "-q"], ["inspect", store], ["verify", store],
                ["bench", store, "--batch-size", "64", "--batches", "3", "--warmup", "1"]]
    for command in commands:
        done = subprocess.run([WINDOWKIT, *command], capture_output=True, text=True,
                              env=_environment(), timeout=180)
        assert not NOISE.search(done.stderr), (command, done.stderr)
        assert done.returncode == 0, (command, done.stderr)


def test_only_tensorflow_log_lines_are_filtered() -> None:
    """What the filter drops (absl/TSL lines below FATAL, absl's notice) and keeps
    (everything else written to file descriptor 2 meanwhile, Python's too)."""
    code = r"""
import os, sys
from windowkit._quiet import filtered_stderr
with filtered_stderr():
    os.write(2, b"WARNING: All log messages before absl::InitializeLog() is called are "
                b"written to STDERR\n")
    os.write(2, b"I0000 00:00:1795548537.190555   26803 port.cc:153] oneDNN custom ops\n")
    os.write(2, b"E0000 00:00:1795548539.370577   26803 cuda_platform.cc:52] failed call\n")
    os.write(2, b"F0000 00:00:1795548539.370577   26803 x.cc:1] fatal stays\n")
    os.write(2, b"a line of the program's own\n")
    print("python's own", file=sys.stderr)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=_environment(), timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        "F0000 00:00:1795548539.370577   26803 x.cc:1] fatal stays",
        "a line of the program's own", "python's own"]


@pytest.mark.parametrize("reader", ["tf_dataset", "keras_dataset", "torch_dataset",
                                    "grain_batches"])
@pytest.mark.parametrize("shuffle", [True, "blocks"])
def test_an_epoch_that_drop_remainder_empties_is_one_warning(
        tmp_path: Path, reader: str, shuffle: object) -> None:
    """A split with fewer windows than one batch and ``drop_remainder=True``
    yields no batch (Keras fit then leaves val_loss out without a word): a
    warning names the split, its windows and the batch size, at the user's line."""
    store = wk.convert(_series(60, 50), tmp_path / "s", format="zarr", window=wk.WindowSpec(4),
                       splits={"train": .7, "val": .3})
    windows = store.num_windows("val")
    if reader == "torch_dataset":
        pytest.importorskip("torch")
    if reader == "grain_batches":
        pytest.importorskip("grain")
    with pytest.warns(UserWarning) as caught:
        getattr(store, reader)("val", windows + 1, shuffle=shuffle, drop_remainder=True)
    messages = [w for w in caught if "drop_remainder" in str(w.message)]
    assert len(messages) == 1 and messages[0].filename == __file__
    assert (f"split 'val' has {windows} windows an epoch, fewer than one batch of "
            f"{windows + 1}") in str(messages[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a batch fits: no warning
        getattr(store, reader)("val", windows, shuffle=shuffle, drop_remainder=True)


def test_inspect_says_which_times_a_split_shows(tmp_path: Path) -> None:
    """Under the history context, train's times are the rows its windows read,
    val's from its first target on: the output says which, text and JSON."""
    frame = pd.DataFrame({"t": pd.date_range("2020-01-01", periods=100, freq="D"),
                          "v": np.arange(100.0)})
    out = tmp_path / "s"
    wk.convert(frame, out, format="zarr", window=wk.WindowSpec(8, horizon=2), time_col="t",
               split_at="2020-03-01", split_context="history")
    summary = describe(out)
    assert summary["split_times_are"] == {"train": "rows", "val": "targets"}
    assert summary["split_times"]["val"][0] == "2020-03-01T00:00:00Z"
    lines = render(summary).splitlines()
    assert any(line.startswith("windows [train]") and "(times 2020-01-01" in line
               for line in lines)
    assert any(line.startswith("windows [val]") and "(target times 2020-03-01" in line
               for line in lines)
