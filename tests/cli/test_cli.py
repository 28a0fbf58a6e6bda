"""The command line through click's CliRunner: output, exit codes, nothing half-written."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import windowkit as wk
from windowkit.cli import main


@pytest.fixture
def npy_dir(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    for name, n in [("a", 400), ("b", 150), ("c", 5)]:
        np.save(tmp_path / f"{name}.npy", rng.normal(size=(n, 3)).astype(np.float32))
    return tmp_path


def run(*args: str) -> object:
    return CliRunner().invoke(main, [str(a) for a in args])


def test_convert_then_inspect(npy_dir: Path, concept_format: str) -> None:
    out = npy_dir / "store"
    result = run("convert", npy_dir / "*.npy", "--format", concept_format, "--out", out,
                 "--window", 16,
                 "--stride", 2, "--horizon", 1, "--quiet")
    assert result.exit_code == 0, result.output
    store = wk.open_store(out)
    assert store.num_windows("train") == len(range(0, 400 - 16, 2)) + len(range(0, 150 - 16, 2))
    result = run("inspect", out)
    assert result.exit_code == 0, result.output
    assert re.search(rf"^format\s+{concept_format}$", result.output, re.M)
    assert "3 (1 too short for a window)" in result.output
    assert re.search(r"^windows \[train\]\s+259$", result.output, re.M)
    result = run("inspect", out, "--json")
    summary = json.loads(result.output)
    assert summary["splits"] == {"train": 259}
    assert summary["rows"] == 555 and summary["too_short_series"] == 1
    assert summary["window"] == {"length": 16, "stride": 2, "sampling_rate": 1, "horizon": 1}
    assert summary["raw_bytes"] == 555 * 3 * 4


def test_format_choice_lists_all_three() -> None:
    result = run("convert", "--help")
    assert "[tfrecord|zarr|parquet]" in result.output
    assert sorted(wk.FORMATS) == sorted(wk.FORMAT_NAMES)


@pytest.mark.parametrize(("size", "expected"), [
    ("64MiB", 64 << 20), ("1GB", 10**9), ("1048576", 1 << 20), ("1.5KiB", 1536)])
def test_part_size_parses_units(npy_dir: Path, size: str, expected: int) -> None:
    out = npy_dir / "s"
    result = run("convert", npy_dir / "a.npy", "--format", "parquet", "--out", out,
                 "--window", 4, "--part-size", size, "-q")
    assert result.exit_code == 0, result.output
    # the manifest's options keep the on-disk key of before parts were called parts
    assert wk.open_store(out).info["options"]["shard_size"] == expected


def test_bad_part_size_is_refused(npy_dir: Path) -> None:
    result = run("convert", npy_dir / "a.npy", "--format", "parquet", "--out", npy_dir / "s",
                 "--window", 4, "--part-size", "lots")
    assert result.exit_code == 2 and "'lots' is not a size" in result.output
    assert not (npy_dir / "s").exists()


def test_the_old_names_of_part_size_and_parts_still_work(npy_dir: Path) -> None:
    """``--shard-size`` and ``--shards`` (and ``shard_size=``, ``shards=``), from
    when parts were called shards, still work; the help lists the new names only."""
    out = npy_dir / "s"
    result = run("convert", npy_dir / "a.npy", "--format", "parquet", "--out", out,
                 "--window", 4, "--block-rows", 64, "--shard-size", "1KiB", "--shards", 3, "-q")
    assert result.exit_code == 0, result.output
    store = wk.open_store(out)
    assert store.info["options"]["shard_size"] == 1024 and len(store.info["data"]["files"]) == 3
    rows = np.load(npy_dir / "a.npy")
    again = wk.convert(rows, npy_dir / "py", format="parquet", window=4, block_rows=64,
                       shards=3, shard_size=1024)
    assert again.info["options"]["shards"] == 3 and len(again.info["data"]["files"]) == 3
    with pytest.raises(wk.InvalidSpecError, match=r"part_size and shard_size \(its old name\) "
                       "are both given; give part_size only"):
        wk.convert(rows, npy_dir / "both", format="parquet", window=4, part_size=2048,
                   shard_size=1024)
    usage = run("convert", "--help").output
    assert "--part-size" in usage and "--parts" in usage and "--shard" not in usage


@pytest.mark.parametrize(("args", "message"), [
    (["missing.npy", "--window", "4"], "missing.npy: no such file"),
    (["a.npy", "--window", "0"], "window length must be an integer >= 1, got 0"),
    (["a.npy", "--window", "4", "--stride", "0"], "stride must be an integer >= 1, got 0"),
    (["a.npy", "--window", "4", "--horizon", "-1"], "horizon must be an integer >= 0, got -1"),
    (["a.npy", "--window", "4", "--sampling-rate", "0"], "sampling rate must be"),
    (["a.npy", "--window", "4", "--block-rows", "0"], "block rows must be an integer >= 1"),
    (["a.npy", "--window", "4", "--workers", "0"], "workers must be an integer >= 1, got 0"),
    (["a.npy", "--window", "4", "--parts", "0"], "parts must be an integer >= 1, got 0"),
    (["a.npy", "--window", "4", "--shards", "0"], "shards must be an integer >= 1, got 0"),
    (["a.npy", "--window", "4", "--parts", "2", "--shards", "3"],
     "--parts and --shards (its old name) are both given; give --parts only"),
])
def test_bad_input_is_one_clear_line(npy_dir: Path, concept_format: str, args: list[str],
                                     message: str) -> None:
    args = [str(npy_dir / args[0]), *args[1:]]
    result = run("convert", *args, "--format", concept_format, "--out", npy_dir / "s")
    assert result.exit_code == 2
    assert result.output.startswith("windowkit: error: ") and message in result.output
    assert result.output.strip().count("\n") == 0 and "Traceback" not in result.output
    assert not (npy_dir / "s").exists()


@pytest.mark.parametrize(("args", "message"), [
    (["--window", "4"], "Missing option '--format'. Choose from: tfrecord, zarr, parquet"),
    (["--window", "4", "--format", "hdf5"], "'hdf5' is not one of 'tfrecord', 'zarr'"),
    (["--window", "x", "--format", "zarr"], "'x' is not a valid integer"),
    (["--window", "4", "--format", "zarr", "--bogus"], "No such option '--bogus'"),
    (["--format", "zarr"], "Missing option '--window'"),
])
def test_every_usage_mistake_is_one_line(npy_dir: Path, args: list[str], message: str) -> None:
    """Click's usage errors (a missing option, a bad choice or type, an unknown
    option) are one line naming the option, a choice's choices on that line."""
    result = run("convert", npy_dir / "a.npy", "--out", npy_dir / "s", *args)
    assert result.exit_code == 2
    assert result.output.startswith("windowkit: error: ") and message in result.output, \
        result.output
    assert result.output.strip().count("\n") == 0 and "Traceback" not in result.output
    assert not (npy_dir / "s").exists()


def test_existing_target_is_refused_then_overwritten(npy_dir: Path, concept_format: str) -> None:
    out = npy_dir / "s"
    base = ["convert", npy_dir / "a.npy", "--format", concept_format, "--out", out, "-q"]
    assert run(*base, "--window", 4).exit_code == 0
    result = run(*base, "--window", 8)
    assert result.exit_code == 2 and "target exists and is not empty" in result.output
    assert "pass --overwrite to replace it" in result.output  # the CLI's flag, not Python's
    assert "overwrite=True" not in result.output
    assert wk.open_store(out).spec.length == 4
    assert run(*base, "--window", 8, "--overwrite").exit_code == 0
    assert wk.open_store(out).spec.length == 8
    assert sorted(p.name for p in npy_dir.iterdir() if p.name.startswith(".")) == []


@pytest.mark.parametrize("command", ["inspect", "verify", "bench"])
def test_a_path_that_is_no_store_is_one_line(tmp_path: Path, command: str) -> None:
    """A missing store, a file, a directory without a manifest: a user error (exit 2,
    one line), never a damaged store (verify's exit 1) nor an OS error."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "data.csv").write_text("a,b\n1,2\n")
    for path, message in ((tmp_path / "nothing", "no such store"),
                          (tmp_path / "data.csv", "is a file, not a windowkit store"),
                          (tmp_path / "empty", "not a windowkit store (no windowkit.json)")):
        result = run(command, path)
        assert result.exit_code == 2, (command, path, result.output)
        assert result.output.count("\n") == 1 and message in result.output, result.output


@pytest.mark.parametrize("reader", ["tf", "keras"])
def test_bench_measures_the_reader_and_the_baseline(npy_dir: Path, concept_format: str,
                                                    reader: str) -> None:
    out = npy_dir / "store"
    assert run("convert", npy_dir / "*.npy", "--format", concept_format, "--out", out, "--window",
               8,
               "--horizon", 2, "-q").exit_code == 0
    plot = npy_dir / "timeline.png"
    result = run("bench", out, "--reader", reader, "--batch-size", 16, "--batches", 10,
                 "--warmup", 2, "--baseline", "--plot", plot, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["format"] == concept_format and report["reader"] == reader
    assert report["run"]["windows"] == 10 * 16
    assert report["run"]["bytes"] == 10 * 16 * (8 + 2) * 3 * 4
    assert report["run"]["windows_s"] > 0 and report["peak_rss_mb"] > 0
    read, gather = report["stages"]
    assert read["name"] == "read+decode" and read["bytes"] >= 555 * 3 * 4
    assert read["windows"] == wk.open_store(out).num_windows("train")
    assert gather["name"] == "gather" and gather["windows"] == 10 * 16
    assert report["baseline"]["windows"] == 10 * 16
    assert report["ratio_to_baseline"] == pytest.approx(
        report["run"]["windows_s"] / report["baseline"]["windows_s"])
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = run("bench", out, "--reader", reader, "--batches", 3, "--batch-size", 8)
    assert text.exit_code == 0, text.output
    assert re.search(r"^  24 windows in 3 batches, .* windows/s, .* MB/s, peak RSS", text.output,
                     re.M)
    assert "read+decode" in text.output and "gather" in text.output
    assert re.search(r"^  mixing: a batch holds .* distinct series .*; a uniform permutation",
                     text.output, re.M)
    assert set(report["mixing"]) == {"series", "blocks", "uniform_series", "uniform_blocks"}


@pytest.mark.parametrize("reader", ["tf", "keras"])
@pytest.mark.parametrize("shuffle", ["blocks", "global", "false"])
def test_bench_mixing_is_what_the_readers_batches_hold(tmp_path: Path, concept_format: str,
                                                       reader: str,
                                                       shuffle: str) -> None:
    """The mixing figures (measured on a stand-in store of row numbers) equal
    those counted from the real batches of a store whose feature 0 is the
    series; the uniform reference has every series in a batch."""
    from windowkit.bench import SHUFFLES, batch_mixing

    lengths = [300, 120, 500, 260, 90, 410, 333, 150]
    series = [np.column_stack([np.full(n, i), np.arange(n)]).astype(np.float32)
              for i, n in enumerate(lengths)]
    store = wk.convert(series, tmp_path / "s", format=concept_format, window=8, block_rows=32)
    mixing = batch_mixing(store, split="train", batch_size=64, reader=reader, shuffle=shuffle,
                          seed=2)
    kwargs = {"shuffle": SHUFFLES[shuffle], "seed": 2, "drop_remainder": True}
    batches = (list(store.tf_dataset("train", 64, **kwargs)) if reader == "tf" else
               [b for b in store.keras_dataset("train", 64, **kwargs)])
    firsts = np.stack([np.asarray(b)[:, 0, :] for b in batches]).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    blocks = (offsets[firsts[..., 0]] + firsts[..., 1]) // 32
    assert mixing.series == pytest.approx(np.mean([len(set(b)) for b in firsts[..., 0]]))
    assert mixing.blocks == pytest.approx(np.mean([len(set(b)) for b in blocks]))
    assert mixing.uniform_series > 7.5
    if shuffle == "none":
        assert mixing.series < 2.5


@pytest.mark.parametrize(("args", "message"), [
    (["--batches", "0"], "batches must be >= 1, got 0"),
    (["--batch-size", "0"], "batch_size must be an integer >= 1, got 0"),
    (["--split", "val"], "split 'val' is not in store"),
])
def test_bench_bad_arguments_are_one_line(npy_dir: Path, args: list[str], message: str) -> None:
    out = npy_dir / "store"
    assert run("convert", npy_dir / "a.npy", "--format", "zarr", "--out", out, "--window", 8,
               "-q").exit_code == 0
    result = run("bench", out, *args)
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and message in result.output, result.output
