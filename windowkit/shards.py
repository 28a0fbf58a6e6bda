"""Plan a store's rows as independent shards and write them, in parallel if asked.

A shard is a run of whole storage blocks of the global rows. Shards share no
block, so they can be written in any order by any process (and later by a
cluster). Each shard reads its own rows from the sources, checks them, updates
its own column statistics and hands them to the format as pieces: the rows of
one series inside one block. Statistics are merged in shard order, so the
result does not depend on the number of workers.
"""

from __future__ import annotations

import itertools
import multiprocessing
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from windowkit.formats import DataLayout, get_format
from windowkit.formats.base import Piece, ShardTask
from windowkit.sources import Series, check_finite
from windowkit.stats import RunningStats

DEFAULT_SHARD_BYTES = 64 << 20


@dataclass(frozen=True)
class SeriesLayout:
    """Where each series' rows lie among the global rows."""

    rows: np.ndarray  # int64 [series]
    row_offset: np.ndarray  # int64 [series]

    @classmethod
    def of(cls, series: list[Series]) -> SeriesLayout:
        rows = np.array([s.rows for s in series], dtype=np.int64)
        return cls(rows, np.concatenate([[0], np.cumsum(rows)[:-1]]).astype(np.int64))

    def pieces_before(self, global_row: int, block_rows: int) -> int:
        """How many pieces (series-within-block runs) start before ``global_row``."""
        block_cuts = -(-global_row // block_rows)
        offsets = self.row_offset[self.row_offset < global_row]
        return int(block_cuts + np.count_nonzero(offsets % block_rows))


def plan_shards(layout: DataLayout, series: SeriesLayout, *, shard_bytes: int,
                shards: int | None) -> list[ShardTask]:
    """Cut the global rows into shards of whole blocks: ``shards`` of them, or as
    many as needed for about ``shard_bytes`` each, spread evenly."""
    num_blocks = -(-layout.total_rows // layout.block_rows)
    if shards is None:
        block_bytes = layout.block_rows * layout.row_bytes
        shards = -(-num_blocks * block_bytes // max(1, shard_bytes))
    count = int(min(max(1, shards), num_blocks))
    bounds = np.arange(count + 1, dtype=np.int64) * num_blocks // count * layout.block_rows
    bounds[-1] = layout.total_rows
    return [
        ShardTask(number=i, count=count, first_row=int(lo), rows=int(hi - lo),
                  first_piece=series.pieces_before(int(lo), layout.block_rows))
        for i, (lo, hi) in enumerate(itertools.pairwise(bounds.tolist()))
    ]


def iter_pieces(sources: list[Series], series: SeriesLayout, layout: DataLayout,
                shard: ShardTask, stats: RunningStats,
                on_rows: Callable[[int], None] | None = None) -> Iterator[Piece]:
    """The shard's rows, read from the sources piece by piece, checked finite."""
    position, stop, number = shard.first_row, shard.first_row + shard.rows, shard.first_piece
    while position < stop:
        sid = int(np.searchsorted(series.row_offset, position, side="right")) - 1
        series_end = int(series.row_offset[sid] + series.rows[sid])
        block_end = (position // layout.block_rows + 1) * layout.block_rows
        end = min(stop, block_end, series_end)
        local = position - int(series.row_offset[sid])
        rows = sources[sid].read(local, local + end - position)
        check_finite(rows, sources[sid], local)
        stats.update(rows)
        if on_rows is not None:
            on_rows(len(rows))
        yield Piece(number=number, series_id=sid, series_rows=int(series.rows[sid]),
                    local_start=local, global_start=position, rows=rows)
        position, number = end, number + 1


@dataclass
class ShardResult:
    summary: dict[str, Any]
    stats: RunningStats
    rows: int


def write_shard(sources: list[Series], series: SeriesLayout, format_name: str,
                data_dir: Path, layout: DataLayout, shard: ShardTask,
                on_rows: Callable[[int], None] | None = None) -> ShardResult:
    stats = RunningStats()

    def read_series(sid: int, start: int, stop: int) -> np.ndarray:
        return sources[sid].read(start, stop)

    pieces = iter_pieces(sources, series, layout, shard, stats, on_rows)
    summary = get_format(format_name).write_shard(data_dir, layout, shard, pieces, read_series)
    return ShardResult(summary, stats, shard.rows)


_worker_sources: list[Series] = []


def _init_worker(sources: list[Series]) -> None:
    global _worker_sources
    _worker_sources = sources


def _write_shard_in_worker(series: SeriesLayout, format_name: str, data_dir: Path,
                           layout: DataLayout, shard: ShardTask) -> ShardResult:
    return write_shard(_worker_sources, series, format_name, data_dir, layout, shard)


def write_shards(sources: list[Series], format_name: str, data_dir: Path, layout: DataLayout,
                 shards: list[ShardTask], *, workers: int,
                 on_rows: Callable[[int], None]) -> tuple[list[dict[str, Any]], RunningStats]:
    """Write every shard (``workers`` processes; 1 = in this process); return the
    shards' summaries in order and the merged column statistics."""
    series = SeriesLayout.of(sources)
    results: list[ShardResult]
    if workers <= 1 or len(shards) == 1:
        results = [write_shard(sources, series, format_name, data_dir, layout, shard, on_rows)
                   for shard in shards]
    else:
        # spawn, not fork: the caller may have started TensorFlow's threads
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(min(workers, len(shards)), mp_context=context,
                                 initializer=_init_worker, initargs=(sources,)) as pool:
            futures = [pool.submit(_write_shard_in_worker, series, format_name, data_dir,
                                   layout, shard) for shard in shards]
            try:
                for future in as_completed(futures):
                    on_rows(future.result().rows)  # the first failure raises here
            except BaseException:
                pool.shutdown(cancel_futures=True)
                raise
            results = [future.result() for future in futures]
    stats = RunningStats()
    for result in results:
        stats.merge(result.stats)
    return [result.summary for result in results], stats
