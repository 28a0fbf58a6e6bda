"""The compact run form of an index table equals the per-window table it came from."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import windowkit as wk
from windowkit.index import IndexWriter, read_window_runs


@st.composite
def index_tables(draw: st.DrawFn) -> tuple[list[tuple[int, np.ndarray]], np.ndarray, int]:
    """Per-series sorted starts with random gaps (as NaN-skipping will leave)."""
    stride = draw(st.integers(1, 3))
    rows = np.array(draw(st.lists(st.integers(1, 60), min_size=1, max_size=5)), dtype=np.int64)
    tables = []
    for sid, n in enumerate(rows):
        keep = draw(st.lists(st.booleans(), min_size=len(range(0, n, stride)),
                             max_size=len(range(0, n, stride))))
        starts = np.arange(0, n, stride, dtype=np.int64)[np.array(keep, dtype=bool)]
        tables.append((sid, starts))
    return tables, rows, stride


@given(data=index_tables(), batch_rows=st.integers(1, 7))
def test_runs_resolve_like_the_table(tmp_path_factory: pytest.TempPathFactory, data: tuple,
                                     batch_rows: int) -> None:
    tables, rows, stride = data
    path = tmp_path_factory.mktemp("idx") / "train.parquet"
    writer = IndexWriter(path, wk.WindowSpec(1, stride=stride))
    for sid, starts in tables:
        writer.add(sid, starts)
    writer.close()
    offsets = np.concatenate([[0], np.cumsum(rows)[:-1]])
    import windowkit.index as index_module

    original = index_module._RUNS_BATCH
    index_module._RUNS_BATCH = batch_rows  # runs must survive record-batch boundaries
    try:
        runs = read_window_runs(path, stride=stride, row_offset=offsets, series_rows=rows)
    finally:
        index_module._RUNS_BATCH = original
    global_starts = np.concatenate([offsets[sid] + s for sid, s in tables])
    assert runs.total == len(global_starts)
    np.testing.assert_array_equal(runs.global_starts(np.arange(runs.total)), global_starts)
    total_rows = int(rows.sum())
    for low in range(0, total_rows + 1, 5):
        high = low + 7
        inside = global_starts[(global_starts >= low) & (global_starts < high)]
        selected = runs.select_rows(np.array([low]), np.array([high]))
        np.testing.assert_array_equal(selected.global_starts(np.arange(selected.total)), inside)


def test_unsorted_index_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "train.parquet"
    writer = IndexWriter(path, wk.WindowSpec(1))
    writer.add(0, np.array([5, 3], dtype=np.int64))
    writer.close()
    with pytest.raises(wk.StoreError, match="not sorted"):
        read_window_runs(path, stride=1, row_offset=np.array([0]),
                              series_rows=np.array([10]))
