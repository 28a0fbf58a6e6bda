"""A newcomer's second hour, on the command line: --no-header, a split without
windows said once, the same convert run again over its finished store, and
TensorFlow's start-up lines under a log level the user exported."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import windowkit as wk

WINDOWKIT = str(Path(sys.executable).with_name("windowkit"))
PPG = np.random.default_rng(7).integers(400, 700, 2483)
TF_NOISE = ("oneDNN", "cuda", "cuInit", "absl", "cpu_feature_guard")


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([WINDOWKIT, *args], capture_output=True, text=True, timeout=240,
                          env=env)


def _ppg(tmp_path: Path) -> str:
    path = tmp_path / "ppg.csv"
    path.write_text("\n".join(str(v) for v in PPG) + "\n")
    return str(path)


def test_no_header_reads_every_row(tmp_path: Path) -> None:
    out = str(tmp_path / "s")
    done = _run("convert", _ppg(tmp_path), "--no-header", "--format", "zarr", "--out", out,
                "--window", "100", "--columns", "0")
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [f"wrote {out}: zarr, 1 series, {len(PPG) - 99} windows"]
    store = wk.open_store(out)
    assert store.manifest.total_rows == len(PPG)
    assert np.array_equal(store.windows("train", [0, -1])[:, :, 0], [PPG[:100], PPG[-100:]])


def test_a_header_of_numbers_is_one_line(tmp_path: Path) -> None:
    source = _ppg(tmp_path)
    done = _run("convert", source, "--format", "zarr", "--out", str(tmp_path / "s"),
                "--window", "100", "-q")
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        f"windowkit: {source}: the header looks like data ({PPG[0]}); pass --no-header if "
        "the file has no header line (its first row is read as the column names)"]


def test_no_header_on_npy_files_is_one_line(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.arange(50.0))
    done = _run("convert", str(tmp_path / "a.npy"), "--no-header", "--format", "zarr",
                "--out", str(tmp_path / "s"), "--window", "4")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "windowkit: error: --no-header applies to CSV files only (Parquet files and "
        "DataFrames name their columns)"]
    assert not (tmp_path / "s").exists()


def test_a_split_without_windows_is_said_once(tmp_path: Path) -> None:
    for k in range(40):
        np.save(tmp_path / f"s{k:02d}.npy", np.arange(20.0) + k)
    out = str(tmp_path / "s")
    done = _run("convert", str(tmp_path / "*.npy"), "--format", "zarr", "--out", out,
                "--window", "12", "--split", "train=0.7,val=0.3")
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        "windowkit: split 'val' holds no windows: each series' part of it is shorter than "
        "a window: at most 6 rows, a window spans 12 ((L+H-1)*R+1)",
        f"wrote {out}: zarr, 40 series, 120 windows"]


def test_the_same_convert_again_has_nothing_to_do(tmp_path: Path) -> None:
    source, out = _ppg(tmp_path), str(tmp_path / "s")
    command = ["convert", source, "--no-header", "--format", "tfrecord", "--out", out,
               "--window", "50"]
    assert _run(*command).returncode == 0
    manifest = (tmp_path / "s" / "windowkit.json").read_bytes()
    again = _run(*command, "--workers", "2")
    assert again.returncode == 0, again.stderr
    assert again.stderr.splitlines() == [
        f"windowkit: {out}: already holds this conversion (the same sources and options); "
        "nothing to do"]
    assert _run(*command, "-q").stderr == ""
    assert (tmp_path / "s" / "windowkit.json").read_bytes() == manifest
    other = _run(*command[:-1], "51")
    assert other.returncode == 2
    assert other.stderr.splitlines() == [
        f"windowkit: error: {out}: target exists and is not empty; pass --overwrite to "
        "replace it"]
    assert (tmp_path / "s" / "windowkit.json").read_bytes() == manifest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ppg.csv", "s"]


@pytest.mark.parametrize("level", ["1", "3"])
def test_commands_stay_quiet_under_an_exported_log_level(tmp_path: Path, level: str) -> None:
    """convert, inspect and bench (which loads TensorFlow): no start-up line."""
    env = {k: v for k, v in os.environ.items() if k != "WINDOWKIT_TF_LOG_LEVEL_DEFAULT"}
    env["TF_CPP_MIN_LOG_LEVEL"] = level
    store = str(tmp_path / "s")
    commands = [["convert", _ppg(tmp_path), "--no-header", "--format", "tfrecord", "--out",
                 store, "--window", "8", "-q"], ["inspect", store]]
    if level == "3":  # at 1, TensorFlow's own errors (no CUDA device) are the user's wish
        commands.append(["bench", store, "--batch-size", "64", "--batches", "3",
                         "--warmup", "1"])
    for command in commands:
        done = _run(*command, env=env)
        assert done.returncode == 0, (command, done.stderr)
        noise = [line for line in done.stderr.splitlines()
                 if any(word in line for word in TF_NOISE)]
        assert not noise, (command, done.stderr)
