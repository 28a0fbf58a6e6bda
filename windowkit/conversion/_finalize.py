"""After the shards: the window index tables, the series table, the statistics
and the manifest, which is written last."""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from windowkit._version import __version__
from windowkit.conversion._plan import StorePlan
from windowkit.conversion._shards import ShardResult, merged_stats
from windowkit.conversion._workspace import Workspace
from windowkit.conversion.options import ConvertOptions
from windowkit.index import IndexWriter, grid_windows, stretches_without
from windowkit.manifest import STATIC_PREFIX, FileEntry, Manifest
from windowkit.sources import Series, StagedSeries
from windowkit.splits import history_rows

log = logging.getLogger("windowkit")


@dataclass
class IndexSummary:
    """What writing the index tables found, per split and per series."""

    splits: dict[str, dict[str, Any]]
    windows_per_series: np.ndarray
    gap_skipped: int = 0
    nan_skipped: int = 0


def write_index_tables(root: Path, plan: StorePlan, missing: np.ndarray) -> IndexSummary:
    """One index table per split: the windows that lie in the split, span no
    time gap and touch no row in ``missing`` (runs of global rows)."""
    shutil.rmtree(root / "index", ignore_errors=True)  # a run interrupted after its shards
    (root / "index").mkdir()
    summary = IndexSummary({}, np.zeros(len(plan.series), dtype=np.int64))
    spec = plan.layout.window
    history = spec.length * spec.sampling_rate if spec.horizon else 0
    for k, name in enumerate(plan.splits.names):
        writer = IndexWriter(root / "index" / f"{name}.parquet", plan.layout.window)
        times: list[int] = []
        reach = plan.splits.window_ranges(k, context=plan.split_context, history_rows=history)
        for sid, series in enumerate(plan.series):
            lo, hi = (int(v) for v in plan.splits.ranges[sid, k])
            if hi > lo:
                _index_series(writer, summary, plan, sid, (int(reach[sid, 0]), hi), missing)
                times += _time_range(series, lo, hi)  # the split's own rows: its targets
        writer.close()
        summary.splits[name] = {"windows": writer.windows, "index": f"index/{name}.parquet",
                                "first_time": min(times) if times else None,
                                "last_time": max(times) if times else None}
    return summary


def _index_series(writer: IndexWriter, summary: IndexSummary, plan: StorePlan, sid: int,
                  rows: tuple[int, int], missing: np.ndarray) -> None:
    """Add the windows of series ``sid`` within ``rows`` of one split."""
    lo, hi = rows
    spec, series = plan.layout.window, plan.series[sid]
    segments = getattr(series, "segments", None) or [(0, series.rows)]
    gap_free = [(max(a, lo), min(b, hi)) for a, b in segments if min(b, hi) > max(a, lo)]
    offset = int(plan.placement.row_offset[sid])
    first, last = np.searchsorted(missing[:, 0], [offset, offset + series.rows])
    valid = stretches_without(gap_free, missing[first:last] - offset)
    got = sum(writer.add_series(sid, b - a, first_row=a) for a, b in valid)
    summary.windows_per_series[sid] += got
    without_gaps = sum(grid_windows(a, b, spec) for a, b in gap_free)
    summary.gap_skipped += grid_windows(lo, hi, spec) - without_gaps
    summary.nan_skipped += without_gaps - got


def _time_range(series: Series, lo: int, hi: int) -> list[int]:
    times = series.times() if isinstance(series, StagedSeries) else None
    return [] if times is None else [int(times[lo]), int(times[hi - 1])]


def write_series_table(root: Path, plan: StorePlan, windows_per_series: np.ndarray) -> None:
    """``series.parquet``: one row per series, with its times when it has them."""
    series = plan.series
    columns: dict[str, Any] = {
        "series": pa.array(np.arange(len(series), dtype=np.int32)),
        "key": pa.array([s.key for s in series], type=pa.string()),
        "rows": pa.array(plan.placement.rows),
        "row_offset": pa.array(plan.placement.row_offset),
        "windows": pa.array(windows_per_series),
        **{name: pa.array(values, type=pa.int64()) for name, values in plan.splits.table_columns(
            context=plan.split_context, history_rows=history_rows(plan.layout.window)).items()}}
    if any(getattr(s, "first_time", None) is not None for s in series):
        for name, attr in (("first_time", "first_time"), ("last_time", "last_time"),
                           ("step", "time_step")):
            columns[name] = pa.array([getattr(s, attr) for s in series], type=pa.int64())
    for k, name in enumerate(plan.static_columns or []):
        assert plan.static_values is not None
        columns[STATIC_PREFIX + name] = pa.array(plan.static_values[:, k])
    pq.write_table(pa.table(columns), root / "series.parquet", write_page_checksum=True)


def static_statistics(plan: StorePlan) -> dict[str, Any] | None:
    """Count, mean, std, min and max of each static feature over the series with
    training rows (what ``normalize=True`` uses for the ``static`` part)."""
    if plan.static_values is None:
        return None
    ranges = plan.splits.train_ranges()
    values = plan.static_values[ranges[:, 1] > ranges[:, 0]]
    if not len(values):
        return None
    return {"count": len(values), "mean": values.mean(axis=0).tolist(),
            "std": values.std(axis=0).tolist(), "min": values.min(axis=0).tolist(),
            "max": values.max(axis=0).tolist()}


def finalize(workspace: Workspace, plan: StorePlan, options: ConvertOptions,
             results: list[ShardResult], data: dict[str, Any]) -> Manifest:
    """Write the index and series tables; return the store's manifest."""
    root = workspace.root
    missing = np.concatenate([r.missing for r in results])  # global rows, ascending
    index = write_index_tables(root, plan, missing)
    write_series_table(root, plan, index.windows_per_series)
    merged = merged_stats(results)
    stats = merged.to_dict()
    if stats is None and merged.count:
        log.warning("%s: the values' statistics overflow float64; the store has no "
                    "normalization statistics (normalize=True is refused)", workspace.out)
    known = {f.path: f for result in results for f in result.files}
    layout, names = plan.layout, plan.splits.names
    first = plan.series[0]
    return Manifest(
        format=options.format, dtype=layout.dtype.name, step_shape=layout.step_shape,
        columns=plan.columns, target_columns=plan.target_columns,
        known_columns=plan.known_columns, static_columns=plan.static_columns,
        static_statistics=static_statistics(plan), window=layout.window,
        total_rows=layout.total_rows, block_rows=layout.block_rows, splits=index.splits,
        series={"count": len(plan.series),
                "too_short": int((plan.placement.rows < layout.window.span).sum()),
                "gap_skipped_windows": index.gap_skipped,
                "nan_skipped_windows": index.nan_skipped,
                "missing_rows": int((missing[:, 1] - missing[:, 0]).sum()),
                **({"time_column": options.table.time_col,
                    "time_unit": getattr(first, "time_unit", ""),
                    "time_zone": getattr(first, "time_zone", None)}
                   if options.table.time_col else {})},
        data=data, normalization=stats,
        options={"compression": options.compression, "seed": options.seed,
                 "block_rows": options.block_rows, "shard_size": options.shard_size,
                 "shards": options.shards, "windowkit": __version__, "nan": options.nan,
                 "split": names, "split_context": options.split.context,
                 "normalization_rows": "train" if "train" in names else names[0]},
        source_fingerprint=plan.fingerprint, store_id=plan.store_id,
        # shard files are in the workspace, or (for a URL target) already uploaded
        files=[known.get(f) or FileEntry.of(root, f)
               for f in sorted(set(workspace.files()) | set(known))])
