"""The conversion pipeline, in small steps:

plan (:mod:`._plan`) -> part tasks written by an executor, resumable
(:mod:`._parts`) -> the format's finish -> index tables, series table,
statistics, manifest (:mod:`._finalize`) -> publish. Where the store goes is
the target's alone (:class:`~._target.StoreTarget`): ``out`` is handed to it at
the start, and the pipeline asks it for the workspace, whether the store is
already built, and to publish.

Everything is written into a locked workspace beside the target and renamed
into place only after the manifest, so an interrupted conversion never leaves a
half store under the target name; running it again resumes from the parts it
finished whose source rows are unchanged.

The source files are pinned before they are read (:class:`SourcePins`) and
checked again before the manifest is written: one rewritten or replaced
meanwhile stops the conversion (nothing published, the workspace kept).
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import shutil
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from windowkit._progress import human_size, progress_bar
from windowkit.conversion._finalize import finalize, notice
from windowkit.conversion._parts import PartResult, source_digest, write_parts
from windowkit.conversion._plan import StorePlan, plan_store
from windowkit.conversion._target import StoreTarget, Workspace
from windowkit.conversion.options import (
    DEFAULT_PART_BYTES,
    ConvertOptions,
    check_arguments,
    column_names,
    one_column,
    part_options,
    python_errors,
    table_dtype,
    window_spec,
)
from windowkit.errors import DiskSpaceError, InvalidSpecError, OutOfMemoryError
from windowkit.formats import get_format
from windowkit.location import AnyPath
from windowkit.manifest import Manifest
from windowkit.sources import (
    DEFAULT_SORT_MEMORY,
    NpySeries,
    Series,
    SourceLike,
    SourcePins,
    TableOptions,
    changed_rows,
    check_consistent,
    csv_file,
    estimate_staged_bytes,
    is_table,
    numeric_header,
    open_sources,
    source_files,
    stage_table,
)
from windowkit.sources._times import duration_text
from windowkit.spec import WindowSpec

if TYPE_CHECKING:
    from windowkit.store import Store

log = logging.getLogger("windowkit")

#: sources up to this size (raw rows) are read again before publishing, and each
#: part's rows compared with those written (larger ones: identity, size and time)
RECHECK_BYTES = 64 << 20


def convert(source: SourceLike, out: str | os.PathLike[str], *, format: str = "zarr",
            window: WindowSpec | int, stride: int | None = None,
            sampling_rate: int | None = None, horizon: int | None = None,
            compression: str | None = None, seed: int = 0,
            block_rows: int | None = None, part_size: int = DEFAULT_PART_BYTES,
            parts: int | None = None, workers: int = 1, overwrite: bool = False,
            progress: bool = False, series_col: str | None = None,
            time_col: str | None = None,
            columns: str | Sequence[str] | None = None,
            dtype: str | np.dtype | type | None = None,
            max_gap: str | int | datetime.timedelta | None = None,
            splits: str | Mapping[str, float] | None = None, split_by: str = "time",
            split_at: str | Sequence[str | int] | None = None, split_context: str = "none",
            nan: str = "error",
            target_columns: str | Sequence[str | int] | None = None,
            known_columns: str | Sequence[str | int] | None = None,
            static_columns: str | Sequence[str] | None = None,
            static: Mapping[str, Any] | None = None,
            sort_memory: int = DEFAULT_SORT_MEMORY, time_format: str | None = None,
            storage_options: dict[str, Any] | None = None, dask: Any = None,
            shard_size: int | None = None, shards: int | None = None,
            header: int | None = 0) -> Store:
    """Write ``source`` into a new store at ``out`` and return it opened.

    ``out`` is a directory or a URL fsspec understands (``s3://bucket/store``,
    ``storage_options`` going to its filesystem): a remote store's parts are
    uploaded as they are written, its tables kept in a local mirror, and the
    manifest written last (:mod:`windowkit.conversion._remote`).

    ``window`` is a :class:`WindowSpec`, or the window length with ``stride``,
    ``sampling_rate`` and ``horizon`` as keywords (``window=32, stride=2,
    horizon=3``; not both). ``source`` is a ``.npy`` path, a glob or list of
    them (one series each), an array (one series of ``[*step_shape]`` steps:
    pass many as a list or dict of arrays), a pandas Series (one series named
    by its ``name``), or a table (below). ``compression``
    defaults to the format's (zstd for Zarr and Parquet, none for TFRecord).
    ``block_rows`` sets the rows per storage block (Zarr chunk, TFRecord record,
    Parquet row group); by default a power of two near 1 MiB (256 KiB for
    TFRecord). The rows are written in *parts* of whole blocks (a TFRecord or
    Parquet part is one data file) of about ``part_size`` bytes of rows, or
    ``parts`` of them (``shard_size`` and ``shards`` are their older names,
    still accepted); ``workers`` processes write parts in
    parallel, or ``dask`` (a ``distributed.Client`` or a scheduler address)
    runs each part as a task on its workers, which write it straight to the
    target (for a local path, one they share). Rows are streamed
    block by block: peak memory does not grow with the source.

    A CSV (also ``.csv.gz``, ``.csv.bz2``, ``.csv.zst``) or Parquet file,
    several of them (a list, a glob, a directory of
    Parquet files, hive-partitioned or not: one table, in path order), or a
    pandas DataFrame, is a table
    (:mod:`windowkit.sources`): ``series_col`` names the series of a long table
    (without it the table is one series), ``time_col`` its times (strictly
    increasing per series; integers, dates, timestamps, or floats holding whole
    numbers such as ``1700.0``; no window spans a gap larger than ``max_gap``,
    by default each series' regular step; on dates and timestamps a duration
    such as ``"16min"``; ISO text times are read as such, other text with
    ``time_format``, strptime codes such as ``"%Y/%m/%d"``; for a DataFrame it
    may name an index level, such as a ``DatetimeIndex`` named ``"date"``), ``columns`` the
    features (a string is one column); ``series_col`` and ``time_col`` each name
    one column. A CSV file's first line names its columns (``header=0``);
    ``header=None`` reads files without one, naming the columns ``"0"``,
    ``"1"``, ... (as pandas does). ``dtype`` (``"float32"``) casts their
    values, refusing one that overflows. A long
    table whose series are interleaved is grouped in memory if it takes at
    most ``sort_memory`` bytes there.

    ``splits`` (``{"train": .8, "val": .2}`` or ``"train=0.8,val=0.2"``) cuts
    each series chronologically (``split_by="series"``: whole series, seeded by
    ``seed``), or ``split_at`` cuts at increasing points in time of ``time_col``
    (``"2015,2018"`` or ``["2015-02-06"]``: a year on dates or timestamps is
    its first day; ISO times are UTC unless they have an offset); windows that would share
    a row with another split are dropped (:mod:`windowkit.splits`).
    ``split_context="history"`` (forecasting, with a horizon) lets a validation
    or test window take its inputs from the rows before its split: it belongs
    to the split holding its targets. Normalization statistics come from the
    training rows only.

    ``target_columns`` (with a horizon) makes targets ``y`` hold only those
    feature columns, ``[H, len(target_columns)]``; inputs keep every column.
    ``known_columns`` (with a horizon) are features whose future values are
    known ahead (calendar, planned prices): batches then also carry their
    values over the horizon, ``future_known [H, K]``. ``static_columns``
    (tables) are columns constant within each series, kept once per series in
    ``series.parquet`` rather than as features (a value that changes is an
    error naming series, row and column); for arrays, ``static`` maps each
    static feature's name to one value per series. Batches then carry
    ``static [S]`` and the window's ``series``.

    ``nan="error"`` refuses NaN, infinity and empty table values, naming series,
    row and column; ``nan="skip"`` keeps those rows and leaves every window
    that touches one out of the index (and the rows out of the statistics).

    A source file rewritten or replaced while it is converted raises
    :class:`~windowkit.errors.SourceChangedError` before anything is published;
    running out of memory raises :class:`~windowkit.errors.OutOfMemoryError`
    saying what to lower. Both keep the finished parts for a re-run.
    """
    with python_errors():  # errors name these arguments, not the CLI's flags
        check_arguments(locals())
        part_size, parts = part_options(part_size, parts, shard_size, shards)
        table = TableOptions(one_column("series_col", series_col),
                             one_column("time_col", time_col), column_names("columns", columns),
                             duration_text(max_gap), time_format,
                             column_names("static_columns", static_columns),
                             table_dtype(dtype), _header(header))
        options = ConvertOptions.of(
            format=format, window=window_spec(window, stride, sampling_rate, horizon),
            compression=compression, splits=splits, split_by=split_by, split_at=split_at,
            split_context=split_context, table=table,
            target_columns=column_names("target_columns", target_columns),
            known_columns=column_names("known_columns", known_columns), static=static,
            seed=seed, block_rows=block_rows, part_size=part_size, parts=parts,
            workers=workers, dask=dask, overwrite=bool(overwrite), progress=bool(progress),
            nan=nan, sort_memory=sort_memory)
        with _out_of_memory():
            target = StoreTarget.of(out, storage_options, overwrite=bool(overwrite))
            return _convert(source, target, options)


def _convert(source: SourceLike, target: StoreTarget, options: ConvertOptions) -> Store:
    """:func:`convert` with its options checked: the store written into the
    target's workspace, and published there (locked and resumable; nothing is
    published if a source file changed meanwhile)."""
    pins = SourcePins.of(source_files(source))  # before reading a byte of them
    series = [] if is_table(source) else _open_arrays(source, options.table)
    with target.building(source_files(source)) as workspace:
        if is_table(source):
            series = _stage(source, workspace, options)
        if target.built is not None:  # the same conversion again: nothing to do, or refused
            target.check_same_conversion(plan_store(series, options).store_id)
            workspace.leave()
        else:
            manifest = _write_store(workspace, target, series, options, pins)
            pins.check()  # again, last thing before the commit
            manifest.write(workspace.root)
            target.publish(workspace)
    return target.open()


@contextlib.contextmanager
def _out_of_memory() -> Iterator[None]:
    """Running out of memory (or of threads) is one line saying what to lower."""
    try:
        yield
    except OutOfMemoryError:
        raise
    except (MemoryError, RuntimeError) as exc:
        if not isinstance(exc, MemoryError) and "can't start new thread" not in str(exc):
            raise
        detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        raise OutOfMemoryError(
            f"out of memory while converting ({detail}); "
            "the finished parts are kept: run the same command again with fewer --workers "
            "or a smaller --part-size, --block-rows or --sort-memory") from None


def _no_header_elsewhere() -> str:
    """The error for ``header=None`` (``--no-header``) given a source not CSV."""
    from windowkit.conversion import options

    named = "--no-header" if options._CLI.get() else "header=None"
    return (f"{named} applies to CSV files only (Parquet files and DataFrames name "
            "their columns)")


def _header(value: Any) -> bool:
    """``header``: 0 (a CSV file's first line names its columns) or None (no header)."""
    if value is None or (value == 0 and not isinstance(value, bool)
                         and isinstance(value, (int, np.integer))):
        return value is not None
    raise InvalidSpecError(f"header must be 0 (the first line names the columns) or None "
                           f"(the file has no header line), got {value!r}")


def _open_arrays(source: SourceLike, table: TableOptions) -> list[Series]:
    if not table.header:
        raise InvalidSpecError(_no_header_elsewhere())
    if table != TableOptions():
        raise InvalidSpecError("--series-col, --time-col, --time-format, --columns, "
                               "--max-gap, --static-columns and --dtype apply to table "
                               "sources (CSV, Parquet, DataFrame) only; for arrays pass "
                               "static={name: values} and cast them yourself")
    return open_sources(source)


def _stage(source: SourceLike, workspace: Workspace, options: ConvertOptions) -> list[Series]:
    """A table's series, staged in the workspace (after checking the disk space);
    a CSV header made only of numbers is said to look like data."""
    if not options.table.header and csv_file(source) is None:
        raise InvalidSpecError(_no_header_elsewhere())
    header = numeric_header(source) if options.table.header else None
    if header is not None:
        path, names = header
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        said = f"{path}: the header looks like data ({shown}); pass {{}} if the file has no " \
               "header line (its first row is read as the column names)"
        notice(said.format("--no-header"), said.format("header=None"))
    _check_disk_space(workspace.root, estimate_staged_bytes(source, options.table),
                      "the staged table and the store")
    return check_consistent(stage_table(source, options.table, workspace.prepare_staging(),
                                        allow_missing=options.skip_missing,
                                        sort_memory=options.sort_memory))


def _check_disk_space(directory: Path, needed: int, what: str = "the store") -> None:
    """Refuse to start writing what cannot fit on the target's disk."""
    free = shutil.disk_usage(directory).free
    if needed > free:
        raise DiskSpaceError(f"{directory}: not enough disk space for {what}: it needs about "
                             f"{human_size(needed)}, {human_size(free)} are free")


def _write_store(workspace: Workspace, target: StoreTarget, series: list[Series],
                 options: ConvertOptions, pins: SourcePins) -> Manifest:
    """Plan the store, write (or reuse) its parts, then its tables; return its
    manifest. Parts go where the target uploads them (``upload_to``, a URL
    prefix), else into the workspace."""
    plan = plan_store(series, options)
    storage = get_format(options.format)
    upload_to = target.upload_to
    finished = _resume_or_start(workspace, target, plan)
    reused = sum(f.bytes for result in finished.values() for f in result.files)
    if upload_to is None:
        _check_disk_space(workspace.root, plan.needed_bytes() - reused)
    else:
        _check_disk_space(workspace.root, plan.table_bytes(), "the store's tables")
    data_dir = workspace.root / "data"
    if not workspace.resumable:
        data_dir.mkdir()
        storage.prepare(data_dir, plan.layout, len(plan.tasks))
        workspace.start(plan.key)
    results = _write_parts(workspace, plan, options, finished, upload_to)
    pins.check()  # the source files are still what they were when pinned
    _recheck_rows(plan, results)  # and, when small, still hold the rows written
    data = storage.finish(data_dir, plan.layout, [r.summary for r in results])
    return finalize(workspace, plan, options, results, data)


def _write_parts(workspace: Workspace, plan: StorePlan, options: ConvertOptions,
                 finished: dict[int, PartResult],
                 upload_to: AnyPath | None) -> list[PartResult]:
    """Every part not finished yet, in ``options.workers`` processes, each
    recorded in the workspace as it finishes; a progress bar on request."""
    row_bytes = plan.layout.rows.row_bytes
    with progress_bar(total=plan.layout.rows.total_rows * row_bytes, desc="convert",
                      enabled=options.progress) as bar:
        return write_parts(plan.series, options.format, workspace.root / "data", plan.layout,
                           plan.tasks, workers=options.workers,
                           on_rows=lambda n: bar.update(n * row_bytes), finished=finished,
                           on_finished=lambda n, r: workspace.part_finished(
                               n, r.to_marker()),
                           train_ranges=plan.splits.train_ranges(),
                           skip_missing=options.skip_missing, dask=options.dask,
                           upload_to=upload_to)


def _recheck_rows(plan: StorePlan, results: list[PartResult]) -> None:
    """Read small ``.npy`` sources again and compare each part's rows with
    those it was written from: a source rewritten in place, even with its size
    and modification time restored, is caught before publishing."""
    layout = plan.layout
    if not all(isinstance(s, NpySeries) for s in plan.series) or (
            layout.rows.total_rows * layout.rows.row_bytes > RECHECK_BYTES):
        return
    for task, result in zip(plan.tasks, results, strict=True):
        if source_digest(plan.series, plan.placement, layout, task) != result.source_digest:
            first = int(np.searchsorted(plan.placement.row_offset, task.first_row,
                                        side="right")) - 1
            raise changed_rows(plan.series[first].where, task.number)


def _resume_or_start(workspace: Workspace, target: StoreTarget,
                     plan: StorePlan) -> dict[int, PartResult]:
    """The finished parts of an interrupted run of this plan whose source rows
    are unchanged (and whose files are in place at the target, uploaded whole);
    else an empty workspace and none."""
    markers = target.parts_in_place(workspace.finished_parts(plan.key))
    tasks = plan.tasks
    if markers is not None:
        for number, marker in sorted(markers.items()):
            if number not in range(len(tasks)) or marker.get("source_digest") != (
                    source_digest(plan.series, plan.placement, plan.layout, tasks[number])):
                log.info("%s: the source rows of part %d changed since the interrupted "
                         "conversion; starting over", workspace.out, number)
                markers = None
                break
    if markers is None:
        workspace.start_over()
        return {}
    workspace.keep_only(markers)
    if markers:
        log.info("%s: resuming an interrupted conversion: %d of %d parts already written",
                 workspace.out, len(markers), len(tasks))
    return {n: PartResult.from_marker(m) for n, m in markers.items()}
