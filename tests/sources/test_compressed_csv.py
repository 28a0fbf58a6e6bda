"""Compressed CSV files (``.csv.gz``, ``.csv.bz2``, ``.csv.zst``, as pandas reads
them) are tables: one file or several, with or without a header, streamed
through their codec; a file that is not what its name says is one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from click.testing import CliRunner

import windowkit as wk
from tests.conftest import oracle_windows
from windowkit.cli import main

CODECS = {"gz": "gzip", "bz2": "bz2", "zst": "zstd"}


def _write(path: Path, text: str) -> Path:
    """``text`` compressed by the codec that ``path``'s suffix names."""
    with pa.CompressedOutputStream(str(path), CODECS[path.suffix[1:]]) as out:
        out.write(text.encode())
    return path


def _panel() -> pd.DataFrame:
    rng = np.random.default_rng(5)
    return pd.DataFrame([{"site": s, "year": y, "load": rng.normal(), "price": rng.normal()}
                         for s in ("north", "south") for y in range(1990, 2010)])


def _convert(source: str | list[str], out: Path, *options: str) -> wk.Store:
    sources = source if isinstance(source, list) else [source]
    result = CliRunner().invoke(main, ["convert", *sources, "--format", "zarr", "--out",
                                       str(out), "-q", "--window", "4", *options])
    assert result.exit_code == 0, result.output
    return wk.open_store(out)


@pytest.mark.parametrize("suffix", sorted(CODECS))
def test_a_compressed_csv_converts_as_the_plain_one(tmp_path: Path, suffix: str) -> None:
    frame = _panel()
    path = _write(tmp_path / f"panel.csv.{suffix}", frame.to_csv(index=False))
    store = _convert(str(path), tmp_path / "s", "--series-col", "site", "--time-col", "year")
    series = [g[["load", "price"]].to_numpy() for _, g in frame.groupby("site", sort=False)]
    got = store.windows("train", np.arange(store.num_windows("train")))
    np.testing.assert_array_equal(got, oracle_windows(series, wk.WindowSpec(4))[0])
    wide = _convert(str(path), tmp_path / "wide", "--columns", "load")
    assert wide.series_table.column("key").to_pylist() == ["panel"]  # not "panel.csv"


def test_several_compressed_files_are_one_table(tmp_path: Path) -> None:
    frame = _panel()
    for k, (_, group) in enumerate(frame.groupby("site", sort=False)):
        _write(tmp_path / f"part-{k}.csv.gz", group.to_csv(index=False))
    store = _convert(str(tmp_path / "part-*.csv.gz"), tmp_path / "s", "--series-col", "site",
                     "--time-col", "year")
    assert store.num_windows("train") == 2 * (20 - 4 + 1)


def test_a_compressed_csv_without_a_header(tmp_path: Path) -> None:
    values = np.arange(30, dtype=np.float64).reshape(15, 2)
    text = "".join(f"{a},{b}\n" for a, b in values)
    path = _write(tmp_path / "r.csv.gz", text)
    with pytest.warns(UserWarning, match=r"r\.csv\.gz: the header looks like data \(0\.0, 1\.0\)"):
        wk.convert(str(path), tmp_path / "told", window=4)  # its first line read as data
    store = _convert(str(tmp_path / "r.csv.gz"), tmp_path / "s", "--no-header")
    got = store.windows("train", np.arange(store.num_windows("train")))
    np.testing.assert_array_equal(got, oracle_windows([values], wk.WindowSpec(4))[0])


def test_a_file_that_is_not_what_its_name_says_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "plain.csv.gz").write_text("a,b\n1,2\n3,4\n")
    result = CliRunner().invoke(main, ["convert", str(tmp_path / "plain.csv.gz"), "--format",
                                       "zarr", "--out", str(tmp_path / "s"), "--window", "1"])
    assert result.exit_code == 2 and result.output.count("\n") == 1
    assert f"{tmp_path / 'plain.csv.gz'}: cannot read the table" in result.output
    assert not (tmp_path / "s").exists()


def test_the_size_estimate_counts_a_compressed_files_text(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk-space check's estimate, from a first block, is about the plain
    file's (the text scaled by the block's compression), not 0, one file or several."""
    from windowkit.sources import _datasets, _tables

    monkeypatch.setattr(_datasets, "CSV_BLOCK_BYTES", 1 << 20)  # the text is several blocks
    values = np.random.default_rng(0).normal(size=(60000, 3)).round(3)
    text = pd.DataFrame(values).to_csv(index=False)
    (tmp_path / "plain.csv").write_text(text)
    packed = str(_write(tmp_path / "packed.csv.gz", text))
    with open(packed, "rb") as fh:
        _, size = _datasets.csv_sample(fh, packed, Path(packed).stat().st_size)
    assert size == pytest.approx(len(text), rel=0.2)
    rows, _ = _datasets.table_rows(_datasets.TableFiles("both", (packed, packed)))
    assert rows == pytest.approx(2 * 60000, rel=0.2)
    options = _tables.TableOptions()
    assert _tables.estimate_staged_bytes(packed, options) == pytest.approx(
        _tables.estimate_staged_bytes(str(tmp_path / "plain.csv"), options), rel=0.1)
