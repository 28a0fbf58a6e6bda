"""After the parts: the window index tables, the series table, the statistics
and the manifest, which is written last."""

from __future__ import annotations

import logging
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from windowkit._version import __version__
from windowkit.conversion._parts import PartResult, merged_stats
from windowkit.conversion._plan import StorePlan, history_hint, split_grid_windows
from windowkit.conversion._target import Workspace
from windowkit.conversion.options import ConvertOptions
from windowkit.errors import InvalidSpecError, user_stacklevel
from windowkit.index import IndexWriter, grid_start, grid_windows, stretches_without
from windowkit.manifest import STATIC_PREFIX, FileEntry, Manifest
from windowkit.sources import StagedSeries
from windowkit.splits import history_rows

log = logging.getLogger("windowkit")


@dataclass
class IndexSummary:
    """What writing the index tables found, per split and per series."""

    splits: dict[str, dict[str, Any]]
    windows_per_series: np.ndarray
    gap_skipped: int = 0
    nan_skipped: int = 0
    # per split: windows left out at time gaps and at missing values
    skipped: dict[str, tuple[int, int]] = field(default_factory=dict)


@dataclass
class _SplitIndex:
    """One split's windows as they are written: counts, and (per series) the time
    of its earliest window's first row (``first_row``: 0, or ``L*R`` for its first
    target under the history context) and of its latest window's last row."""

    first_row: int = 0
    gap_skipped: int = 0
    nan_skipped: int = 0
    first_times: list[int] = field(default_factory=list)
    last_times: list[int] = field(default_factory=list)


def write_index_tables(root: Path, plan: StorePlan, missing: np.ndarray) -> IndexSummary:
    """One index table per split: the windows that lie in the split, span no
    time gap and touch no row in ``missing`` (runs of global rows). A split's
    times run from its windows' first row (their first target under the history
    context: a val/test window's inputs may lie in an earlier split) to their
    last."""
    shutil.rmtree(root / "index", ignore_errors=True)  # a run interrupted after its parts
    (root / "index").mkdir()
    summary = IndexSummary({}, np.zeros(len(plan.series), dtype=np.int64))
    history = history_rows(plan.layout.window)
    for k, name in enumerate(plan.splits.names):
        writer = IndexWriter(root / "index" / f"{name}.parquet", plan.layout.window)
        targets_only = plan.split_context == "history" and k != plan.splits.train_split
        found = _SplitIndex(first_row=history if targets_only else 0)
        reach = plan.splits.window_ranges(k, context=plan.split_context, history_rows=history)
        for sid in range(len(plan.series)):
            lo, hi = (int(v) for v in plan.splits.ranges[sid, k])
            if hi > lo:
                _index_series(writer, summary, found, plan, sid, (int(reach[sid, 0]), hi),
                              missing)
        writer.close()
        summary.gap_skipped += found.gap_skipped
        summary.nan_skipped += found.nan_skipped
        summary.skipped[name] = (found.gap_skipped, found.nan_skipped)
        summary.splits[name] = {"windows": writer.windows, "index": f"index/{name}.parquet",
                                "first_time": min(found.first_times, default=None),
                                "last_time": max(found.last_times, default=None)}
    return summary


def _index_series(writer: IndexWriter, summary: IndexSummary, found: _SplitIndex,
                  plan: StorePlan, sid: int, rows: tuple[int, int], missing: np.ndarray
                  ) -> None:
    """Add the windows of series ``sid`` within ``rows`` of one split."""
    lo, hi = rows
    spec, series = plan.layout.window, plan.series[sid]
    segments = getattr(series, "segments", None) or [(0, series.rows)]
    gap_free = [(max(a, lo), min(b, hi)) for a, b in segments if min(b, hi) > max(a, lo)]
    offset = int(plan.placement.row_offset[sid])
    first, last = np.searchsorted(missing[:, 0], [offset, offset + series.rows])
    valid = stretches_without(gap_free, missing[first:last] - offset)
    starts = []  # (first start, last start) of each stretch holding windows
    for a, b in valid:
        count = writer.add_series(sid, b - a, first_row=a)
        if count:
            aligned = grid_start(a, spec.stride)
            starts.append((aligned, aligned + (count - 1) * spec.stride))
    got = sum((end - begin) // spec.stride + 1 for begin, end in starts)
    summary.windows_per_series[sid] += got
    without_gaps = sum(grid_windows(a, b, spec) for a, b in gap_free)
    found.gap_skipped += grid_windows(lo, hi, spec) - without_gaps
    found.nan_skipped += without_gaps - got
    times = series.times() if isinstance(series, StagedSeries) and starts else None
    if times is not None:
        found.first_times.append(int(times[starts[0][0] + found.first_row]))
        found.last_times.append(int(times[starts[-1][1] + spec.span - 1]))


def check_windows(plan: StorePlan, index: IndexSummary) -> None:
    """A conversion yielding no window is an error saying why; a split without
    windows (beside others with some) is one warning line saying why. (Neither
    names the target: a remote one is written in a local mirror first.)"""
    counts = {name: int(entry["windows"]) for name, entry in index.splits.items()}
    if not sum(counts.values()):
        raise InvalidSpecError("the conversion yields no window: " + _why_none(
            index.gap_skipped, index.nan_skipped))
    grid = split_grid_windows(plan.splits, plan.layout.window, plan.split_context)
    for k, name in enumerate(plan.splits.names):
        if counts[name]:
            continue
        reason = _why_none(*index.skipped[name]) if grid[k] else _too_short(plan, k)
        notice(f"split {name!r} holds no windows: {reason}")


def notice(message: str, python: str | None = None) -> None:
    """One line the user must see: the CLI prints it (a warning of the package's
    logger); Python gets a :class:`UserWarning` (its logger has only a
    NullHandler), naming the arguments instead of the CLI's flags (as
    :func:`windowkit.conversion.options.python_errors` does for errors), or
    saying ``python`` when given."""
    from windowkit.conversion import options

    if options._CLI.get():
        log.warning("%s", message)
        return
    warnings.warn(python or options.python_spelling(message), UserWarning,
                  stacklevel=user_stacklevel())


def _why_none(gap_skipped: int, nan_skipped: int) -> str:
    """Why windows that fit on the grid were all left out."""
    reasons = []
    if gap_skipped:
        reasons.append(f"{gap_skipped:,} would span a time gap (longer than --max-gap, by "
                       "default 1.5 regular steps)")
    if nan_skipped:
        reasons.append(f"{nan_skipped:,} would touch a row with NaN, inf or an empty value "
                       "(left out by --nan skip)")
    return (f"all {gap_skipped + nan_skipped:,} windows that fit are left out: "
            + "; ".join(reasons))


def _too_short(plan: StorePlan, k: int) -> str:
    """Why split ``k`` has no window on the grid: its rows, per series, are too few."""
    ranges = plan.splits.ranges[:, k, :]
    rows = ranges[:, 1] - ranges[:, 0]
    spec = plan.layout.window
    if not rows.any():
        return "no series has a row in it"
    return (f"each series' part of it is shorter than a window: at most {int(rows.max()):,} "
            f"rows, a window spans {spec.span} ((L+H-1)*R+1)"
            + history_hint(plan.splits, spec, plan.split_context, k))


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
             results: list[PartResult], data: dict[str, Any]) -> Manifest:
    """Write the index and series tables; return the store's manifest."""
    root = workspace.root
    missing = np.concatenate([r.missing for r in results])  # global rows, ascending
    index = write_index_tables(root, plan, missing)
    check_windows(plan, index)
    write_series_table(root, plan, index.windows_per_series)
    merged = merged_stats(results)
    stats = merged.to_dict()
    if stats is None and merged.count:
        notice(f"{workspace.out}: the values' statistics overflow float64; the store has "
               "no normalization statistics (normalize=True is refused)")
    known = {f.path: f for result in results for f in result.files}
    layout, names = plan.layout, plan.splits.names
    first = plan.series[0]
    return Manifest.of(dict(
        format=options.format, dtype=layout.rows.dtype.name, step_shape=layout.rows.step_shape,
        columns=plan.columns, target_columns=plan.target_columns,
        known_columns=plan.known_columns, static_columns=plan.static_columns,
        static_statistics=static_statistics(plan), window=layout.window.to_dict(),
        total_rows=layout.rows.total_rows, block_rows=layout.rows.block_rows, splits=index.splits,
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
        # "shard_size" and "shards": part_size and parts, under their on-disk keys (kept)
        options={"compression": options.compression, "seed": options.seed,
                 "block_rows": options.block_rows, "shard_size": options.part_size,
                 "shards": options.parts, "windowkit": __version__, "nan": options.nan,
                 "split": names, "split_context": options.split.context,
                 "normalization_rows": "train" if "train" in names else names[0]},
        source_fingerprint=plan.fingerprint, store_id=plan.store_id,
        # part files are in the workspace, or (for a URL target) already uploaded
        files=[(known.get(f) or FileEntry.of(root, f)).model_dump()
               for f in sorted(set(workspace.files()) | set(known))]))
