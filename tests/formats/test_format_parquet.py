"""Parquet stores: the format contracts (tests/format_contract.py,
tests/hostile_contract.py), and what only Parquet promises: ordinary tables
that pandas reads back as written, one row group per storage block."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import windowkit as wk
from tests.format_contract import FormatTests
from tests.helpers import random_series
from tests.hostile_contract import HostileStoreTests, expect_errors


def test_pandas_reads_back_the_source_rows(tmp_path: Path) -> None:
    pd = pytest.importorskip("pandas")
    series = random_series([300, 17, 450], features=4)
    store = wk.convert(series, tmp_path / "s", format="parquet", window=8, block_rows=64)
    frame = pd.read_parquet(store.path / "data")
    assert list(frame.columns) == ["series", "row", "f0", "f1", "f2", "f3"]
    assert all(frame[c].dtype == np.float32 for c in ["f0", "f1", "f2", "f3"])
    np.testing.assert_array_equal(frame[["f0", "f1", "f2", "f3"]].to_numpy(),
                                  np.concatenate(series))
    np.testing.assert_array_equal(frame["series"].to_numpy(),
                                  np.repeat([0, 1, 2], [300, 17, 450]))
    np.testing.assert_array_equal(frame["row"].to_numpy(),
                                  np.concatenate([np.arange(n) for n in [300, 17, 450]]))


@pytest.mark.parametrize("workers", [1, 2])
def test_row_groups_are_the_storage_blocks(tmp_path: Path, workers: int) -> None:
    """One row group per block of 64 rows, whatever the series inside it (the
    17-row series shares its block with its neighbours)."""
    series = random_series([300, 17, 450], features=2)
    store = wk.convert(series, tmp_path / "s", format="parquet", window=8, block_rows=64,
                       part_size=2000, workers=workers)  # several part files
    files = sorted((store.path / "data").glob("part-*.parquet"))
    assert len(files) == 4  # 12 blocks of 64 rows x 2 x float32 (512 B) in ~2000 B files
    sizes, series_in = [], []
    for path in files:
        meta = pq.ParquetFile(path).metadata
        for g in range(meta.num_row_groups):
            group = pq.ParquetFile(path).read_row_group(g, columns=["series"])
            series_in.append(sorted(set(group.column("series").to_pylist())))
            sizes.append(meta.row_group(g).num_rows)
    assert sizes == [64] * 11 + [767 - 11 * 64]
    assert series_in == [[0]] * 4 + [[0, 1, 2]] + [[2]] * 7  # rows 256..319: 300 | 17 | 450
    np.testing.assert_array_equal(store.windows("train", [0, 292, 303])[2], series[2][:8])


def test_frames_are_a_fixed_size_list_column(tmp_path: Path) -> None:
    frames = np.arange(40 * 2 * 3 * 3, dtype=np.float64).reshape(40, 2, 3, 3)
    store = wk.convert([frames], tmp_path / "s", format="parquet",
                       window=wk.WindowSpec(4, horizon=1), block_rows=16)
    table = pq.read_table(store.path / "data")
    assert table.schema.field("values").type.list_size == 18
    np.testing.assert_array_equal(
        np.asarray(table.column("values").to_pylist()).reshape(40, 2, 3, 3), frames)
    x, y = store.windows("train", [35])
    np.testing.assert_array_equal(x[0], frames[35:39])
    np.testing.assert_array_equal(y[0], frames[39:40])


def test_page_checksums_and_statistics_are_written(tmp_path: Path) -> None:
    store = wk.convert(random_series([100], 2), tmp_path / "s", format="parquet", window=4)
    meta = pq.ParquetFile(next((store.path / "data").glob("*.parquet"))).metadata
    column = meta.row_group(0).column(2)
    assert column.compression == "ZSTD"
    assert column.is_stats_set and column.statistics.has_min_max


class TestParquet(FormatTests, HostileStoreTests):
    """The format contracts for Parquet stores, and a row group that is not one
    storage block (on the contract's fresh copy of a pristine store)."""

    format_name = "parquet"

    def test_a_parquet_row_group_larger_than_a_block_is_refused(self, store: Path) -> None:
        part = store / "data/part-00000.parquet"

        def change(_: Path) -> None:
            table = pq.read_table(part)
            pq.write_table(table, part, row_group_size=len(table))

        expect_errors(store, change, "not one storage block")
