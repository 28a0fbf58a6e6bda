"""The conversion pipeline: sources -> rows in a format -> index tables -> manifest.

Everything is written into a locked workspace beside the target
(:mod:`windowkit.workspace`) and renamed into place only after the manifest,
so an interrupted conversion never leaves a half store under the target name;
running it again resumes from the shards it finished.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from windowkit._progress import human_size, progress_bar
from windowkit._version import __version__
from windowkit.errors import (
    DiskSpaceError,
    InvalidSpecError,
    StoreExistsError,
    WindowkitError,
)
from windowkit.formats import DataLayout, get_format
from windowkit.formats.base import ShardTask
from windowkit.index import IndexWriter, stretches_without
from windowkit.manifest import FileEntry, Manifest
from windowkit.shards import (
    DEFAULT_SHARD_BYTES,
    SeriesLayout,
    ShardResult,
    merged_stats,
    plan_shards,
    source_digest,
    write_shards,
)
from windowkit.sources import (
    ArraySeries,
    NpySeries,
    Series,
    SourceLike,
    check_consistent,
    open_sources,
    source_files,
)
from windowkit.spec import WindowSpec
from windowkit.splits import SplitPlan, parse_fractions, split_names_for
from windowkit.tables import (
    DEFAULT_SORT_MEMORY,
    StagedSeries,
    TableOptions,
    estimate_staged_bytes,
    is_table,
    parse_time,
    stage_table,
)
from windowkit.workspace import Workspace, check_target

if TYPE_CHECKING:
    from windowkit.store import Store

log = logging.getLogger("windowkit")



def choose_block_rows(row_bytes: int, min_rows: int, target_bytes: int) -> int:
    """Rows per storage block: a power of two near ``target_bytes``, at least ``min_rows``."""
    rows = max(1, target_bytes // max(1, row_bytes))
    rows = 1 << round(np.log2(rows))
    while rows < min_rows:
        rows *= 2
    return rows


def _as_spec(window: WindowSpec | int) -> WindowSpec:
    if isinstance(window, WindowSpec):
        return window
    return WindowSpec(length=window)


def _fingerprint(series: list[Series]) -> str:
    """A digest of what the sources are: files by path, size and modification
    time (their rows are checked shard by shard on resume), arrays and tables
    read from a DataFrame by a digest of their content."""
    parts: list[Any] = []
    for s in series:
        entry: dict[str, Any] = {"key": s.key, "rows": s.rows, "dtype": str(s.dtype),
                                 "step_shape": list(s.step_shape)}
        if isinstance(s, StagedSeries):
            entry.update(source=s.source_id, features=list(s.features))
        elif isinstance(s, NpySeries):
            stat = os.stat(s.path)
            entry.update(path=os.path.abspath(s.path), bytes=stat.st_size,
                         mtime_ns=stat.st_mtime_ns)
        elif isinstance(s, ArraySeries):
            entry.update(content=s.content_digest())
        parts.append(entry)
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _check_disk_space(directory: Path, needed: int, what: str = "the store") -> None:
    """Refuse to start writing what cannot fit on the target's disk."""
    free = shutil.disk_usage(directory).free
    if needed > free:
        raise DiskSpaceError(f"{directory}: not enough disk space for {what}: it needs about "
                             f"{human_size(needed)}, {human_size(free)} are free")


@dataclass(frozen=True)
class SplitOptions:
    fractions: dict[str, float] | None = None
    by: str = "time"
    at: str | Sequence[str | int] | None = None
    seed: int = 0

    def plan(self, series: list[Series]) -> SplitPlan:
        rows = np.array([s.rows for s in series], dtype=np.int64)
        if self.by not in ("time", "series"):
            raise InvalidSpecError(f"split_by must be 'time' or 'series', got {self.by!r}")
        if self.at is not None:
            points = self.at.split(",") if isinstance(self.at, str) else list(self.at)
            unit = getattr(series[0], "time_unit", "")
            cuts = sorted(parse_time(p, unit) for p in points)
            names = split_names_for(len(cuts), self.fractions)
            times = [s.times() if isinstance(s, StagedSeries) else None for s in series]
            return SplitPlan.at_times(times, cuts, names)
        if self.fractions is None:
            return SplitPlan.single(rows)
        if self.by == "series":
            return SplitPlan.by_series(rows, self.fractions, self.seed)
        return SplitPlan.chronological(rows, self.fractions)


def _time_columns(series: list[Series]) -> dict[str, Any]:
    """First/last time and regular step per series (null without a time column)."""
    if not any(getattr(s, "first_time", None) is not None for s in series):
        return {}
    return {name: pa.array([getattr(s, attr) for s in series], type=pa.int64())
            for name, attr in (("first_time", "first_time"), ("last_time", "last_time"),
                               ("step", "time_step"))}


def _series_runs(runs: np.ndarray, row_offset: int, rows: int) -> np.ndarray:
    """The runs of global rows (sorted) that lie in one series, series-local."""
    lo, hi = np.searchsorted(runs[:, 0], [row_offset, row_offset + rows])
    return runs[lo:hi] - row_offset


def _check_count(name: str, value: int | None, *, minimum: int = 1) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or value < minimum):
        raise InvalidSpecError(f"{name} must be an integer >= {minimum}, got {value!r}")


def convert(source: SourceLike, out: str | os.PathLike[str], *, format: str = "zarr",
            window: WindowSpec | int, compression: str | None = None, seed: int = 0,
            block_rows: int | None = None, shard_size: int = DEFAULT_SHARD_BYTES,
            shards: int | None = None, workers: int = 1, overwrite: bool = False,
            progress: bool = False, series_col: str | None = None,
            time_col: str | None = None, columns: Sequence[str] | None = None,
            max_gap: str | int | None = None,
            splits: str | Mapping[str, float] | None = None, split_by: str = "time",
            split_at: str | Sequence[str | int] | None = None, nan: str = "error",
            target_columns: Sequence[str] | None = None,
            sort_memory: int = DEFAULT_SORT_MEMORY, time_format: str | None = None) -> Store:
    """Write ``source`` into a new store at ``out`` and return it opened.

    ``window`` is a :class:`WindowSpec` or a window length. ``compression``
    defaults to the format's (zstd for Zarr and Parquet, none for TFRecord).
    ``block_rows`` sets the rows per storage block (Zarr chunk, TFRecord record,
    Parquet row group); by default a power of two near 1 MiB (256 KiB for
    TFRecord). Data files
    (TFRecord shards, Parquet parts) hold about ``shard_size`` bytes of rows, or
    there are ``shards`` of them; ``workers`` processes write shards in
    parallel. Rows are streamed block by block: peak memory does not grow with
    the source.

    A CSV or Parquet file, or a pandas DataFrame, is a table
    (:mod:`windowkit.tables`): ``series_col`` names the series of a long table
    (without it the table is one series), ``time_col`` its times (strictly
    increasing per series; no window spans a gap larger than ``max_gap``,
    by default each series' regular step; a text time column is parsed with
    ``time_format``, strptime codes such as ``"%Y/%m/%d"``), ``columns`` the
    features. A long
    table whose series are interleaved is grouped in memory if it takes at
    most ``sort_memory`` bytes there.

    ``splits`` (``{"train": .8, "val": .2}`` or ``"train=0.8,val=0.2"``) cuts
    each series chronologically (``split_by="series"``: whole series, seeded by
    ``seed``), or ``split_at`` cuts at points in time; windows that would share
    a row with another split are dropped (:mod:`windowkit.splits`).
    Normalization statistics come from the training rows only.

    ``target_columns`` (with a horizon) makes targets ``y`` hold only those
    feature columns, ``[H, len(target_columns)]``; inputs keep every column.

    ``nan="error"`` refuses NaN, infinity and empty table values, naming series,
    row and column; ``nan="skip"`` keeps those rows and leaves every window
    that touches one out of the index (and the rows out of the statistics).
    """
    from windowkit.store import open_store

    spec = _as_spec(window)
    storage = get_format(format)
    compression = storage.default_compression if compression is None else compression
    if compression not in storage.compressions:
        raise InvalidSpecError(
            f"compression {compression!r} is not valid for {format}; "
            f"expected one of {', '.join(storage.compressions)}"
        )
    _check_count("block rows", block_rows)
    _check_count("shard size", shard_size)
    _check_count("shards", shards)
    _check_count("workers", workers)
    if nan not in ("error", "skip"):
        raise InvalidSpecError(f"nan must be 'error' or 'skip', got {nan!r}")
    table = TableOptions(series_col, time_col, tuple(columns) if columns else None, max_gap,
                         time_format)
    split = SplitOptions(parse_fractions(splits), split_by, split_at, seed)
    from_table = is_table(source)
    series: list[Series] = []
    if not from_table:
        if table != TableOptions():
            raise InvalidSpecError("series_col, time_col, time_format, columns and max_gap "
                                   "apply to table sources (CSV, Parquet, DataFrame) only")
        series = open_sources(source)  # checked before anything is written
    out = Path(out)
    check_target(out, overwrite=overwrite, sources=source_files(source))
    workspace = Workspace(out)
    workspace.lock()  # before staging: a second conversion must not touch our files
    try:
        if from_table:
            _check_disk_space(workspace.root, estimate_staged_bytes(source, table),
                              "the staged table and the store")
            series = check_consistent(stage_table(source, table, workspace.prepare_staging(),
                                                  allow_missing=nan == "skip",
                                                  sort_memory=sort_memory))
        _write_and_publish(workspace, series, storage_name=format, spec=spec,
                           compression=compression, seed=seed, block_rows=block_rows,
                           shard_size=shard_size, shards=shards, workers=workers,
                           progress=progress, split=split, overwrite=overwrite,
                           time_info=table if from_table else None, nan=nan,
                           target_columns=target_columns)
    except BaseException as exc:
        _after_failure(workspace, exc)
        raise
    finally:
        workspace.release()
    return open_store(out)


def _after_failure(workspace: Workspace, exc: BaseException) -> None:
    """Leave nothing behind after a user mistake; keep finished shards after
    anything else (an interruption, a read error, too little space, a target
    that appeared meanwhile), so that the same command resumes."""
    mistake = isinstance(exc, WindowkitError) and not isinstance(
        exc, (DiskSpaceError, StoreExistsError))
    if workspace.inherited or (workspace.resumable and not mistake):
        shutil.rmtree(workspace.staging, ignore_errors=True)
        log.info("%s: conversion stopped; run the same command again to resume it",
                 workspace.out)
    else:
        workspace.discard()


def _column_names(series: list[Series]) -> list[str] | None:
    """Feature names: a table's columns, else ``f0 .. f{F-1}`` for vector steps."""
    first = series[0]
    features = getattr(first, "features", None)
    if features:
        return list(features)
    return [f"f{i}" for i in range(first.step_shape[0])] if first.step_shape else None


def _resolve_targets(names: Sequence[str] | None, series: list[Series],
                     spec: WindowSpec) -> list[str] | None:
    """The target columns by name (a feature's name, or its position for arrays)."""
    if not names:
        return None
    columns = _column_names(series)
    if spec.horizon == 0:
        raise InvalidSpecError("target columns need a horizon (--horizon H >= 1): "
                               "without one a window has no target")
    if columns is None or len(series[0].step_shape) != 1:
        raise InvalidSpecError(f"target columns need rows that are vectors of features; "
                               f"these rows have shape {series[0].step_shape}")
    chosen = []
    for name in (str(n).strip() for n in names):
        if name in columns:
            chosen.append(name)
        elif name.isdigit() and int(name) < len(columns):
            chosen.append(columns[int(name)])
        else:
            raise InvalidSpecError(f"target column {name!r} is not a feature column "
                                   f"(features: {', '.join(columns)})")
    if len(set(chosen)) != len(chosen):
        raise InvalidSpecError(f"target columns repeat a column: {', '.join(chosen)}")
    return chosen


def _write_and_publish(workspace: Workspace, series: list[Series], *, spec: WindowSpec,
                       split: SplitOptions, overwrite: bool,
                       target_columns: Sequence[str] | None, **options: Any) -> None:
    longest = max(s.rows for s in series)
    if longest < spec.span:
        raise InvalidSpecError(
            f"a window spans {spec.span} rows (length {spec.length}, horizon {spec.horizon}, "
            f"sampling rate {spec.sampling_rate}), longer than every series (longest: "
            f"{longest} rows)")
    targets = _resolve_targets(target_columns, series, spec)
    manifest = _write_store(workspace, series, spec=spec, plan=split.plan(series),
                            target_columns=targets, **options)
    manifest.write(workspace.root)
    workspace.publish(overwrite=overwrite)


def _plan_key(fingerprint: str, storage_name: str, layout: DataLayout,
              tasks: list[ShardTask], seed: int, splits: SplitPlan, nan: str) -> str:
    """A digest of everything the data files' rows depend on."""
    plan = {"sources": fingerprint, "format": storage_name,
            "window": layout.window.to_dict(), "compression": layout.compression,
            "block_rows": layout.block_rows, "seed": seed, "windowkit": __version__,
            "shards": [[t.first_row, t.rows] for t in tasks], "splits": splits.key(),
            "nan": nan}
    return hashlib.sha256(json.dumps(plan, sort_keys=True).encode()).hexdigest()


def _store_id(plan_key: str, time_info: TableOptions | None,
              target_columns: list[str] | None) -> str:
    """The store id: a digest of everything the store's bytes depend on, so the
    same conversion (resumed, or on other workers) gives the same store."""
    table = None if time_info is None else [time_info.series_col, time_info.time_col,
                                            time_info.columns, str(time_info.max_gap),
                                            time_info.time_format]
    key = json.dumps([plan_key, table, target_columns], sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def _resume_or_start(workspace: Workspace, plan_key: str, sources: list[Series],
                     layout: DataLayout, tasks: list[ShardTask]) -> dict[int, ShardResult]:
    """The finished shards of an interrupted run of this plan whose source rows
    are unchanged; else an empty workspace and none."""
    markers = workspace.finished_shards(plan_key)
    if markers is not None:
        placement = SeriesLayout.of(sources)
        for number, marker in sorted(markers.items()):
            if number not in range(len(tasks)) or marker.get("source_digest") != (
                    source_digest(sources, placement, layout, tasks[number])):
                log.info("%s: the source rows of shard %d changed since the interrupted "
                         "conversion; starting over", workspace.out, number)
                markers = None
                break
    if markers is None:
        workspace.start_over()
        return {}
    workspace.keep_only(markers)
    if markers:
        log.info("%s: resuming an interrupted conversion: %d of %d shards already written",
                 workspace.out, len(markers), len(tasks))
    return {n: ShardResult.from_marker(m) for n, m in markers.items()}


def _needed_bytes(layout: DataLayout, placement: SeriesLayout, storage_name: str) -> int:
    """About what the store takes on disk, at most: data files, index tables
    (compressed, under 2 bytes a window) and the series table."""
    pieces = placement.pieces_before(layout.total_rows, layout.block_rows)
    data = get_format(storage_name).max_data_bytes(layout, pieces)
    return data + 2 * layout.total_rows + 256 * len(placement.rows) + (1 << 20)


def _write_store(workspace: Workspace, series: list[Series], *, storage_name: str,
                 spec: WindowSpec, compression: str, seed: int, block_rows: int | None,
                 shard_size: int, shards: int | None, workers: int,
                 progress: bool, plan: SplitPlan,
                 time_info: TableOptions | None = None, nan: str = "error",
                 target_columns: list[str] | None = None) -> Manifest:
    root = workspace.root
    first = series[0]
    dtype, step_shape = first.dtype, first.step_shape
    storage = get_format(storage_name)
    row_bytes = dtype.itemsize * int(np.prod(step_shape, dtype=np.int64))
    placement = SeriesLayout.of(series)
    rows, row_offset = placement.rows, placement.row_offset
    total_rows = int(rows.sum())
    layout = DataLayout(
        dtype=dtype, step_shape=step_shape, total_rows=total_rows,
        block_rows=block_rows or choose_block_rows(row_bytes, storage.min_block_rows(spec),
                                                   storage.target_block_bytes),
        window=spec, compression=compression)
    data_dir = root / "data"
    tasks = plan_shards(layout, placement, shard_bytes=shard_size, shards=shards)
    fingerprint = _fingerprint(series)
    plan_key = _plan_key(fingerprint, storage_name, layout, tasks, seed, plan, nan)
    layout = dataclasses.replace(layout, store_id=_store_id(plan_key, time_info,
                                                            target_columns))
    finished = _resume_or_start(workspace, plan_key, series, layout, tasks)
    reused = sum(f.bytes for result in finished.values() for f in result.files)
    _check_disk_space(root, _needed_bytes(layout, placement, storage_name) - reused)
    if not workspace.resumable:
        data_dir.mkdir()
        storage.prepare(data_dir, layout, len(tasks))
        workspace.start(plan_key)
    with progress_bar(total=total_rows * row_bytes, desc="convert", enabled=progress) as bar:
        results = write_shards(series, storage_name, data_dir, layout, tasks, workers=workers,
                               on_rows=lambda n: bar.update(n * row_bytes), finished=finished,
                               on_finished=lambda n, r: workspace.shard_finished(
                                   n, r.to_marker()), train_ranges=plan.train_ranges(),
                               skip_missing=nan == "skip")
    data_info = storage.finish(data_dir, layout, [r.summary for r in results])
    stats = merged_stats(results)
    if stats.count and stats.to_dict() is None:
        log.warning("%s: the values' statistics overflow float64; the store has no "
                    "normalization statistics (normalize=True is refused)", workspace.out)
    known = {f.path: f for result in results for f in result.files}

    shutil.rmtree(root / "index", ignore_errors=True)  # a run interrupted after its shards
    (root / "index").mkdir()
    windows_per_series = np.zeros(len(series), dtype=np.int64)
    missing = np.concatenate([r.missing for r in results])  # global rows, ascending
    gap_skipped = nan_skipped = 0
    split_info: dict[str, dict[str, Any]] = {}
    for k, name in enumerate(plan.names):
        writer = IndexWriter(root / "index" / f"{name}.parquet", spec)
        times: list[int] = []
        for sid, s in enumerate(series):
            lo, hi = (int(v) for v in plan.ranges[sid, k])
            if hi <= lo:
                continue
            gap_free = [(max(a, lo), min(b, hi)) for a, b in
                        getattr(s, "segments", None) or [(0, s.rows)] if min(b, hi) > max(a, lo)]
            valid = stretches_without(gap_free, _series_runs(missing, int(row_offset[sid]),
                                                             s.rows))
            got = sum(writer.add_series(sid, b - a, first_row=a) for a, b in valid)
            windows_per_series[sid] += got
            without_gaps = sum(spec.num_windows(b - a) for a, b in gap_free)
            gap_skipped += spec.num_windows(hi - lo) - without_gaps
            nan_skipped += without_gaps - got
            series_times = s.times() if isinstance(s, StagedSeries) else None
            if series_times is not None:
                times += [int(series_times[lo]), int(series_times[hi - 1])]
        writer.close()
        split_info[name] = {"windows": writer.windows, "index": f"index/{name}.parquet",
                            "first_time": min(times) if times else None,
                            "last_time": max(times) if times else None}

    pq.write_table(pa.table({
        "series": pa.array(np.arange(len(series), dtype=np.int32)),
        "key": pa.array([s.key for s in series], type=pa.string()),
        "rows": pa.array(rows),
        "row_offset": pa.array(row_offset),
        "windows": pa.array(windows_per_series),
        **_time_columns(series),
    }), root / "series.parquet", write_page_checksum=True)

    return Manifest(
        format=storage_name,
        dtype=dtype.name,
        step_shape=step_shape,
        columns=_column_names(series),
        target_columns=target_columns,
        window=spec,
        total_rows=total_rows,
        block_rows=layout.block_rows,
        splits=split_info,
        series={"count": len(series), "too_short": int((rows < spec.span).sum()),
                "gap_skipped_windows": gap_skipped, "nan_skipped_windows": nan_skipped,
                "missing_rows": int((missing[:, 1] - missing[:, 0]).sum()),
                **({"time_column": time_info.time_col, "time_unit": getattr(first, "time_unit", ""),
                    "time_zone": getattr(first, "time_zone", None)}
                   if time_info is not None and time_info.time_col else {})},
        data={**data_info, "compression": compression, "raw_bytes": total_rows * row_bytes},
        normalization=stats.to_dict(),
        options={"compression": compression, "seed": seed, "block_rows": block_rows,
                 "shard_size": shard_size, "shards": shards, "windowkit": __version__,
                 "nan": nan,
                 "split": plan.names, "normalization_rows": "train" if "train" in plan.names
                 else plan.names[0]},
        source_fingerprint=fingerprint,
        store_id=layout.store_id,
        files=[known.get(f) or FileEntry.of(root, f) for f in workspace.files()],
    )


