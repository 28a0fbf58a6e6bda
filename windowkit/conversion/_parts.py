"""Plan a store's rows as independent parts and write them, in parallel if asked.

A part is a run of whole storage blocks of the global rows. Parts share no
block, so they can be written in any order by any process (and later by a
cluster). Each part reads its own rows from the sources, checks them, updates
its own column statistics and hands them to the format as pieces: the rows of
one series inside one block. Statistics are merged in part order, so the
result does not depend on the number of workers.

Worker processes end with the conversion: the kernel kills them when the main
process dies (Linux: ``PR_SET_PDEATHSIG``; elsewhere a watchdog thread), each
checks its parent before writing a part, and a failure or an interruption in
the main process terminates them before it returns, so nothing writes into the
workspace after the conversion has stopped.
"""

from __future__ import annotations

import ctypes
import errno
import itertools
import multiprocessing
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from windowkit.conversion._files import fsync
from windowkit.conversion._remote import upload_files
from windowkit.errors import DiskSpaceError, OutOfMemoryError
from windowkit.formats import DataLayout, get_format
from windowkit.formats.base import PartTask, Piece
from windowkit.location import AnyPath
from windowkit.manifest import FileEntry
from windowkit.sources import Series, check_finite
from windowkit.stats import RunningStats


@dataclass(frozen=True)
class SeriesLayout:
    """Where each series' rows lie among the global rows."""

    rows: np.ndarray  # int64 [series]
    row_offset: np.ndarray  # int64 [series]
    train: np.ndarray | None = None  # int64 [series, 2]: rows feeding the statistics

    @classmethod
    def of(cls, series: list[Series]) -> SeriesLayout:
        rows = np.array([s.rows for s in series], dtype=np.int64)
        return cls(rows, np.concatenate([[0], np.cumsum(rows)[:-1]]).astype(np.int64))

    def pieces_before(self, global_row: int, block_rows: int) -> int:
        """How many pieces (series-within-block runs) start before ``global_row``."""
        block_cuts = -(-global_row // block_rows)
        offsets = self.row_offset[self.row_offset < global_row]
        return int(block_cuts + np.count_nonzero(offsets % block_rows))


def plan_parts(layout: DataLayout, series: SeriesLayout, *, part_bytes: int,
               parts: int | None) -> list[PartTask]:
    """Cut the global rows into parts of whole blocks: ``parts`` of them, or as
    many as needed for about ``part_bytes`` each, spread evenly."""
    num_blocks = layout.rows.num_blocks
    if parts is None:
        block_bytes = layout.rows.block_rows * layout.rows.row_bytes
        parts = -(-num_blocks * block_bytes // max(1, part_bytes))
    count = int(min(max(1, parts), num_blocks))
    bounds = np.arange(count + 1, dtype=np.int64) * num_blocks // count * layout.rows.block_rows
    bounds[-1] = layout.rows.total_rows
    return [
        PartTask(number=i, count=count, first_row=int(lo), rows=int(hi - lo),
                  first_piece=series.pieces_before(int(lo), layout.rows.block_rows))
        for i, (lo, hi) in enumerate(itertools.pairwise(bounds.tolist()))
    ]


def missing_rows(rows: np.ndarray) -> np.ndarray:
    """Which rows hold a NaN or an infinity anywhere (bool ``[rows]``)."""
    if rows.dtype.kind != "f":
        return np.zeros(len(rows), dtype=bool)
    return ~np.isfinite(rows.reshape(len(rows), -1)).all(axis=1)


def true_runs(mask: np.ndarray) -> np.ndarray:
    """The runs of ``True`` in ``mask`` as ``[k, 2]`` int64 ``(start, stop)``."""
    edges = np.flatnonzero(np.diff(np.concatenate([[False], mask, [False]]).astype(np.int8)))
    return edges.reshape(-1, 2).astype(np.int64)


def _source_extent(layout: DataLayout, part: PartTask) -> tuple[int, int]:
    """The global rows a part is made from: its own, and the halo rows after them
    that a format may copy (TFRecord)."""
    stop = part.first_row + part.rows
    return part.first_row, min(layout.rows.total_rows, stop + layout.window.span - 1)


def _read_global(sources: list[Series], series: SeriesLayout, start: int, stop: int,
                 chunk_rows: int) -> Iterator[np.ndarray]:
    """Global rows ``[start, stop)`` from the sources, in pieces of at most
    ``chunk_rows`` rows that never cross a series."""
    position = start
    while position < stop:
        sid = int(np.searchsorted(series.row_offset, position, side="right")) - 1
        local = position - int(series.row_offset[sid])
        end = min(stop, int(series.row_offset[sid] + series.rows[sid]), position + chunk_rows)
        yield sources[sid].read(local, local + end - position)
        position = end


def source_digest(sources: list[Series], series: SeriesLayout, layout: DataLayout,
                  part: PartTask) -> str:
    """A digest of the source rows a part is made from (read again, in blocks)."""
    digest = xxhash.xxh3_128()
    for rows in _read_global(sources, series, *_source_extent(layout, part),
                             chunk_rows=layout.rows.block_rows):
        digest.update(np.ascontiguousarray(rows).data)
    return digest.hexdigest()


def iter_pieces(sources: list[Series], series: SeriesLayout, layout: DataLayout,
                part: PartTask, stats: RunningStats,
                on_rows: Callable[[int], None] | None = None,
                missing: list[np.ndarray] | None = None,
                digest: Any = None) -> Iterator[Piece]:
    """The part's rows, read from the sources piece by piece. Rows holding NaN
    or infinity are an error, or with a ``missing`` list they are kept, left
    out of the statistics and appended to it as runs of global rows. ``digest``
    (an xxhash object) sees every row read."""
    position, stop, number = part.first_row, part.first_row + part.rows, part.first_piece
    while position < stop:
        sid = int(np.searchsorted(series.row_offset, position, side="right")) - 1
        series_end = int(series.row_offset[sid] + series.rows[sid])
        block_end = (position // layout.rows.block_rows + 1) * layout.rows.block_rows
        end = min(stop, block_end, series_end)
        local = position - int(series.row_offset[sid])
        rows = sources[sid].read(local, local + end - position)
        if digest is not None:
            digest.update(np.ascontiguousarray(rows).data)
        if missing is None:
            check_finite(rows, sources[sid], local)
            bad = None
        else:
            bad = missing_rows(rows)
            if bad.any():
                missing.append(true_runs(bad) + position)
        lo, hi = 0, len(rows)
        if series.train is not None:  # statistics of training rows only
            lo, hi = (int(v) - local for v in series.train[sid])
            lo, hi = max(lo, 0), min(hi, len(rows))
        if hi > lo:
            stats.update(rows[lo:hi] if bad is None else rows[lo:hi][~bad[lo:hi]])
        if on_rows is not None:
            on_rows(len(rows))
        yield Piece(number=number, series_id=sid, series_rows=int(series.rows[sid]),
                    local_start=local, global_start=position, rows=rows)
        position, number = end, number + 1


@dataclass
class PartResult:
    summary: dict[str, Any]
    stats: RunningStats
    rows: int
    files: list[FileEntry]  # the part's data files, on disk (fsynced), with checksums
    source_digest: str  # of the source rows the part was made from (see source_digest)
    # runs (start, stop) of global rows holding NaN or infinity, kept with nan="skip"
    missing: np.ndarray = field(default_factory=lambda: np.empty((0, 2), dtype=np.int64))

    def to_marker(self) -> dict[str, Any]:
        """A JSON-able record of the finished part (exact: statistics included)."""
        return {"summary": self.summary, "stats": self.stats.state(), "rows": self.rows,
                "files": [f.model_dump() for f in self.files],
                "source_digest": self.source_digest, "missing": self.missing.tolist()}

    @classmethod
    def from_marker(cls, marker: dict[str, Any]) -> PartResult:
        missing = np.asarray(marker.get("missing") or [], dtype=np.int64).reshape(-1, 2)
        return cls(marker["summary"], RunningStats.from_state(marker["stats"]),
                   int(marker["rows"]), [FileEntry(**f) for f in marker["files"]],
                   str(marker.get("source_digest", "")), missing)


def write_part(sources: list[Series], series: SeriesLayout, format_name: str,
               data_dir: Path, layout: DataLayout, part: PartTask,
               on_rows: Callable[[int], None] | None = None,
               skip_missing: bool = False) -> PartResult:
    stats = RunningStats()
    missing: list[np.ndarray] | None = [] if skip_missing else None
    digest = xxhash.xxh3_128()

    def read_series(sid: int, start: int, stop: int) -> np.ndarray:
        return sources[sid].read(start, stop)

    storage = get_format(format_name)
    pieces = iter_pieces(sources, series, layout, part, stats, on_rows, missing, digest)
    try:
        summary = storage.write_part(data_dir, layout, part, pieces, read_series)
    except OSError as exc:
        if exc.errno not in _NO_SPACE:
            raise
        names = ", ".join(str(data_dir / n)
                          for n in storage.part_files(data_dir, layout, part))
        raise DiskSpaceError(f"{exc.filename or names}: {exc.strerror or exc} while writing "
                             f"part {part.number}; the finished parts are kept: make room "
                             "and run the same command again to resume") from None
    first, last = _source_extent(layout, part)  # then the rows after it (halos)
    for rows in _read_global(sources, series, first + part.rows, last,
                             chunk_rows=layout.rows.block_rows):
        digest.update(np.ascontiguousarray(rows).data)
    root = data_dir.parent
    files = []
    for name in storage.part_files(data_dir, layout, part):
        fsync(data_dir / name)
        files.append(FileEntry.of(root, str((data_dir / name).relative_to(root))))
    runs = np.concatenate(missing) if missing else np.empty((0, 2), dtype=np.int64)
    return PartResult(summary, stats, part.rows, files, digest.hexdigest(), runs)


def write_part_and_upload(sources: list[Series], series: SeriesLayout, format_name: str,
                          layout: DataLayout, part: PartTask, skip_missing: bool,
                          upload_to: AnyPath) -> PartResult:
    """Write a part into a temporary directory, then upload its files under
    ``upload_to`` (a URL prefix standing for the store's root): what a worker
    does for a store on object storage. Idempotent: the same part uploads the
    same bytes."""
    storage = get_format(format_name)
    with tempfile.TemporaryDirectory(prefix="windowkit-part-") as scratch:
        data_dir = Path(scratch) / "data"
        data_dir.mkdir()
        storage.prepare(data_dir, layout, part.count)  # the format's empty store
        result = write_part(sources, series, format_name, data_dir, layout, part,
                            skip_missing=skip_missing)
        upload_files(Path(scratch), [f.path for f in result.files], upload_to)
    return result


_NO_SPACE = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_worker_sources: list[Series] = []
_worker_parent = 0  # the process that started this worker


def _init_worker(sources: list[Series], parent: int) -> None:
    """A worker: it dies with the process that started it, and leaves Ctrl-C to
    that process, which stops the workers itself."""
    global _worker_sources, _worker_parent
    _worker_sources, _worker_parent = sources, parent
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if not _die_with_parent():
        threading.Thread(target=_watch_parent, name="windowkit-watchdog", daemon=True).start()
    _check_parent()  # it may have died before the line above


def _die_with_parent() -> bool:
    """Ask the kernel (Linux) to kill this process when its parent dies."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _check_parent() -> None:
    """End this worker at once if the process that started it is gone."""
    if os.getppid() != _worker_parent:
        os._exit(1)


def _watch_parent() -> None:
    while True:
        _check_parent()
        time.sleep(0.2)


def _write_part_to(sources: list[Series], series: SeriesLayout, format_name: str,
                   data_dir: Path, layout: DataLayout, part: PartTask, skip_missing: bool,
                   upload_to: AnyPath | None,
                   on_rows: Callable[[int], None] | None = None) -> PartResult:
    """A part written into ``data_dir``, or with ``upload_to`` where it runs and
    uploaded there."""
    if upload_to is None:
        return write_part(sources, series, format_name, data_dir, layout, part, on_rows,
                          skip_missing)
    result = write_part_and_upload(sources, series, format_name, layout, part,
                                   skip_missing, upload_to)
    if on_rows is not None:
        on_rows(result.rows)
    return result


def _write_part_in_worker(*args: Any) -> PartResult:
    _check_parent()  # never write for a conversion that has ended
    return _write_part_to(_worker_sources, *args)


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """Stop the pool's workers now (not after their current parts) and wait
    for them: after a failure or an interruption nothing writes any more."""
    workers = list((getattr(pool, "_processes", None) or {}).values())
    for process in workers:
        if process.is_alive():
            process.terminate()
    for process in workers:
        process.join(timeout=10)
    pool.shutdown(wait=True, cancel_futures=True)


def write_parts(sources: list[Series], format_name: str, data_dir: Path, layout: DataLayout,
                parts: list[PartTask], *, workers: int, on_rows: Callable[[int], None],
                finished: dict[int, PartResult] | None = None,
                on_finished: Callable[[int, PartResult], None] | None = None,
                train_ranges: np.ndarray | None = None,
                skip_missing: bool = False, dask: Any = None,
                upload_to: AnyPath | None = None) -> list[PartResult]:
    """Write every part not already ``finished`` (``workers`` processes; 1 = in
    this process; or tasks on the Dask cluster ``dask``), calling
    ``on_finished`` as each completes; return all the parts' results in part
    order. ``skip_missing`` keeps rows holding NaN or infinity (and reports
    them) instead of refusing them. With ``upload_to`` (a URL prefix), each
    part is written in a scratch directory where it runs and uploaded there."""
    placement = SeriesLayout.of(sources)
    series = SeriesLayout(placement.rows, placement.row_offset, train_ranges)
    results: dict[int, PartResult] = dict(finished or {})
    todo = [part for part in parts if part.number not in results]
    for number in results:
        on_rows(results[number].rows)

    def record(number: int, result: PartResult) -> None:
        results[number] = result
        if on_finished is not None:
            on_finished(number, result)

    if dask is not None:
        from windowkit.conversion._dask import dask_client, run_on_dask

        def done(number: int, result: PartResult) -> None:
            on_rows(result.rows)
            record(number, result)

        with dask_client(dask) as client:
            run_on_dask(client, _write_part_to, [
                (part.number, (sources, series, format_name, data_dir, layout, part,
                               skip_missing, upload_to)) for part in todo], done)
    elif workers <= 1 or len(todo) <= 1:
        for part in todo:
            record(part.number, _write_part_to(sources, series, format_name, data_dir,
                                               layout, part, skip_missing, upload_to,
                                               on_rows))
    else:
        # spawn, not fork: the caller may have started TensorFlow's threads
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(min(workers, len(parts)), mp_context=context,
                                 initializer=_init_worker,
                                 initargs=(sources, os.getpid())) as pool:
            try:
                futures = {pool.submit(_write_part_in_worker, series, format_name, data_dir,
                                       layout, part, skip_missing, upload_to): part.number
                           for part in todo}
                for future in as_completed(futures):
                    result = future.result()  # the first failure raises here
                    on_rows(result.rows)
                    record(futures[future], result)
            except BrokenProcessPool:
                _stop_workers(pool)
                raise OutOfMemoryError("a worker process died (killed by the system, most likely "
                                 "out of memory); the finished parts are kept: run the same "
                                 "command again with fewer --workers or a smaller "
                                 "--part-size") from None
            except BaseException:
                _stop_workers(pool)
                raise
    return [results[part.number] for part in parts]


def merged_stats(results: list[PartResult]) -> RunningStats:
    """The parts' column statistics merged in part order (deterministic)."""
    stats = RunningStats()
    for result in results:
        stats.merge(result.stats)
    return stats
