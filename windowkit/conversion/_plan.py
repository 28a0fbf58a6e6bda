"""Plan a store before writing it: the layout of its rows, its parts, its
splits, and the keys that identify it (to resume, and as the store id)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from windowkit._version import __version__
from windowkit.conversion._parts import SeriesLayout, plan_parts
from windowkit.conversion.options import ConvertOptions
from windowkit.errors import InvalidSpecError
from windowkit.formats import DataLayout, get_format
from windowkit.formats.base import PartTask
from windowkit.layout import RowLayout
from windowkit.sources import ArraySeries, NpySeries, RemoteNpySeries, Series, StagedSeries
from windowkit.spec import WindowSpec
from windowkit.splits import SplitPlan, history_rows


@dataclass(frozen=True)
class StorePlan:
    """What a conversion writes, decided before it writes anything."""

    format: str
    series: list[Series]
    layout: DataLayout  # with the store id
    placement: SeriesLayout  # where each series' rows lie among the global rows
    tasks: list[PartTask]
    splits: SplitPlan
    columns: list[str] | None
    target_columns: list[str] | None
    known_columns: list[str] | None  # values known over the horizon (future_known)
    fingerprint: str  # of the sources
    key: str  # of everything the data files depend on: resume only the same plan
    split_context: str = "none"  # what val/test windows may read (windowkit.splits)
    static_columns: list[str] | None = None  # one value per series (series.parquet)
    static_values: np.ndarray | None = None  # float64 [series, static columns]

    @property
    def store_id(self) -> str:
        return self.layout.store_id

    def needed_bytes(self) -> int:
        """About what the store takes on disk, at most: data files, index tables
        (compressed, under 2 bytes a window) and the series table."""
        layout = self.layout
        pieces = self.placement.pieces_before(layout.rows.total_rows, layout.rows.block_rows)
        data = get_format(self.format).max_data_bytes(layout, pieces)
        return data + self.table_bytes()

    def table_bytes(self) -> int:
        """About what the index tables and the series table take, at most."""
        return 2 * self.layout.rows.total_rows + 256 * len(self.series) + (1 << 20)


def choose_block_rows(row_bytes: int, min_rows: int, target_bytes: int) -> int:
    """Rows per storage block: a power of two near ``target_bytes``, at least ``min_rows``."""
    rows = max(1, target_bytes // max(1, row_bytes))
    rows = 1 << round(np.log2(rows))
    while rows < min_rows:
        rows *= 2
    return rows


def plan_store(series: list[Series], options: ConvertOptions) -> StorePlan:
    """The plan of the store ``options`` ask for, from the checked ``series``."""
    spec = options.window
    _check_longest(series, spec)
    storage = get_format(options.format)
    first = series[0]
    placement = SeriesLayout.of(series)
    unblocked = RowLayout(first.dtype, first.step_shape, int(placement.rows.sum()), 1)
    block_rows = options.block_rows or choose_block_rows(
        unblocked.row_bytes, storage.min_block_rows(spec), storage.target_block_bytes)
    columns = column_names(series)
    layout = DataLayout(rows=dataclasses.replace(unblocked, block_rows=block_rows),
                        window=spec, compression=options.compression,
                        columns=tuple(columns) if columns else None)
    tasks = plan_parts(layout, placement, part_bytes=options.part_size, parts=options.parts)
    splits = options.split.plan(series)
    check_some_window(splits, spec, options.split.context)
    fingerprint = _fingerprint(series)
    key = _plan_key(fingerprint, options, layout, tasks, splits)
    static_names, static_values = _static_features(series, options)
    targets = _resolve_columns("target", options.target_columns, series, spec, static_names)
    known = _resolve_columns("known", options.known_columns, series, spec, static_names)
    layout = dataclasses.replace(layout, store_id=_store_id(key, options, targets))
    return StorePlan(format=options.format, series=series, layout=layout, placement=placement,
                     tasks=tasks, splits=splits, columns=columns,
                     target_columns=targets, known_columns=known, fingerprint=fingerprint,
                     key=key, split_context=options.split.context,
                     static_columns=static_names, static_values=static_values)


def _check_longest(series: list[Series], spec: WindowSpec) -> None:
    """A conversion yielding no window is an error: here, every series too short."""
    longest = max(s.rows for s in series)
    if longest < spec.span:
        raise InvalidSpecError(
            f"no window fits: a window spans {spec.span} rows ((L+H-1)*R+1 with length "
            f"L={spec.length}, horizon H={spec.horizon}, sampling rate R="
            f"{spec.sampling_rate}), longer than every series (longest: {longest} rows)")


def grid_counts(ranges: np.ndarray, spec: WindowSpec) -> np.ndarray:
    """Per row range ``[lo, hi)`` (``[n, 2]``), the windows on the series' stride
    grid that lie wholly in it (before gaps and missing values remove any)."""
    lo, hi = ranges[..., 0], ranges[..., 1]
    aligned = -(-lo // spec.stride) * spec.stride
    usable = hi - aligned - (spec.steps - 1) * spec.sampling_rate
    return np.where(usable > 0, -(-usable // spec.stride), 0)


def split_grid_windows(splits: SplitPlan, spec: WindowSpec, context: str) -> np.ndarray:
    """Per split, its windows on the series' grids (before gaps and missing values)."""
    history = history_rows(spec)
    return np.array([int(grid_counts(splits.window_ranges(k, context=context,
                                                          history_rows=history), spec).sum())
                     for k in range(len(splits.names))], dtype=np.int64)


def check_some_window(splits: SplitPlan, spec: WindowSpec, context: str) -> None:
    """A conversion yielding no window is an error: here, the splits cut every
    series into parts shorter than a window (checked before writing anything)."""
    if split_grid_windows(splits, spec, context).sum() > 0:
        return
    longest = ", ".join(f"{name} {int((splits.ranges[:, k, 1] - splits.ranges[:, k, 0]).max())}"
                        for k, name in enumerate(splits.names))
    raise InvalidSpecError(
        f"no window fits in any split: a window spans {spec.span} rows ((L+H-1)*R+1), more "
        f"than any series' part of a split holds (longest: {longest} rows)"
        + history_hint(splits, spec, context))


def history_hint(splits: SplitPlan, spec: WindowSpec, context: str, split: int | None = None
                 ) -> str:
    """What the history split context would give (all splits, or ``split``), as
    a hint to append to a message; empty where it would not help."""
    if context == "history" or spec.horizon == 0 or len(splits.names) < 2:
        return ""
    counts = split_grid_windows(splits, spec, "history")
    gained = int(counts.sum() if split is None else counts[split])
    if not gained:
        return ""
    return (f"; --split-context history would give "
            f"{'it' if split is not None else 'the splits after training'} {gained:,} "
            "windows, their inputs reaching into the rows before the split")


def _fingerprint(series: list[Series]) -> str:
    """A digest of what the sources are: files by path, size and modification
    time (their rows are checked part by part on resume), arrays and tables
    read from a DataFrame by a digest of their content."""
    entries: list[Any] = []
    for s in series:
        entry: dict[str, Any] = {"key": s.key, "rows": s.rows, "dtype": str(s.dtype),
                                 "step_shape": list(s.step_shape)}
        if isinstance(s, StagedSeries):
            entry.update(source=s.source_id, features=list(s.features))
        elif isinstance(s, NpySeries):
            stat = os.stat(s.path)
            entry.update(path=os.path.abspath(s.path), bytes=stat.st_size,
                         mtime_ns=stat.st_mtime_ns)
        elif isinstance(s, RemoteNpySeries):
            entry.update(path=s.path, version=s.version)
        elif isinstance(s, ArraySeries):
            entry.update(content=s.content_digest())
        entries.append(entry)
    return hashlib.sha256(json.dumps(entries, sort_keys=True).encode()).hexdigest()


def _plan_key(fingerprint: str, options: ConvertOptions, layout: DataLayout,
              tasks: list[PartTask], splits: SplitPlan) -> str:
    """A digest of everything the data files' rows depend on (its key
    "shards", the parts' rows, keeps the old word: a workspace's recorded
    plan must match)."""
    plan = {"sources": fingerprint, "format": options.format,
            "window": layout.window.to_dict(), "compression": layout.compression,
            "block_rows": layout.rows.block_rows, "seed": options.seed, "windowkit": __version__,
            "shards": [[t.first_row, t.rows] for t in tasks], "splits": splits.key(),
            "nan": options.nan, "columns": layout.columns}
    return hashlib.sha256(json.dumps(plan, sort_keys=True).encode()).hexdigest()


def _store_id(plan_key: str, options: ConvertOptions, targets: list[str] | None) -> str:
    """The store id: a digest of everything the store's bytes depend on, so the
    same conversion (resumed, or on other workers) gives the same store."""
    table = options.table
    key = json.dumps([plan_key, [table.series_col, table.time_col, table.columns,
                                 str(table.max_gap), table.time_format], targets]
                     + ([list(options.known_columns)] if options.known_columns else [])
                     + ([list(options.table.static_columns)] if options.table.static_columns
                        else [])
                     + ([{k: np.asarray(v, dtype=np.float64).tolist()
                          for k, v in options.static.items()}] if options.static else [])
                     + ([options.split.context] if options.split.context != "none" else []),
                     sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def column_names(series: list[Series]) -> list[str] | None:
    """Feature names: a table's columns, else ``f0 .. f{F-1}`` for vector steps."""
    first = series[0]
    features = getattr(first, "features", None)
    if features:
        return list(features)
    return [f"f{i}" for i in range(first.step_shape[0])] if first.step_shape else None


def _static_features(series: list[Series], options: ConvertOptions
                     ) -> tuple[list[str] | None, np.ndarray | None]:
    """The static features' names and values (``[series, S]`` float64): a table's
    static columns, or the ``static`` mapping given with arrays."""
    table_static = options.table.static_columns
    if table_static:
        return list(table_static), np.array([getattr(s, "static", ()) for s in series],
                                            dtype=np.float64)
    if not options.static:
        return None, None
    if isinstance(series[0], StagedSeries):
        raise InvalidSpecError("static= is for array sources; name a table's static "
                               "columns with static_columns=")
    names, values = [], []
    for name, given in options.static.items():
        try:
            column = np.asarray(given, dtype=np.float64).reshape(-1)
        except (TypeError, ValueError):
            raise InvalidSpecError(f"static {name!r}: the values are not numbers") from None
        if len(column) != len(series):
            raise InvalidSpecError(f"static {name!r} holds {len(column)} values; there are "
                                   f"{len(series)} series, one value each")
        if not np.isfinite(column).all():
            at = int(np.flatnonzero(~np.isfinite(column))[0])
            raise InvalidSpecError(f"static {name!r}: series {at} ({series[at].key}) has a "
                                   "NaN or infinite value")
        names.append(str(name))
        values.append(column)
    return names, np.column_stack(values)


def _resolve_columns(role: str, names: Sequence[str] | None, series: list[Series],
                     spec: WindowSpec, static: list[str] | None = None) -> list[str] | None:
    """The ``role`` columns (``target``: what ``y`` holds; ``known``: values known
    over the horizon) by name: a feature's name, or its position for arrays."""
    if not names:
        return None
    for name in (str(n).strip() for n in names):
        if name in (static or []):
            raise InvalidSpecError(f"{role} column {name!r} is a static column (one value "
                                   "per series), not a feature; it cannot also be a "
                                   f"{role} column")
    columns = column_names(series)
    if spec.horizon == 0:
        raise InvalidSpecError(f"{role} columns need a horizon (--horizon H >= 1): "
                               "without one a window has no future rows")
    if columns is None or len(series[0].step_shape) != 1:
        raise InvalidSpecError(f"{role} columns need rows that are vectors of features; "
                               f"these rows have shape {series[0].step_shape}")
    chosen = []
    for name in (str(n).strip() for n in names):
        if name in columns:
            chosen.append(name)
        elif name.isdigit() and int(name) < len(columns):
            chosen.append(columns[int(name)])
        else:
            raise InvalidSpecError(f"{role} column {name!r} is not a feature column "
                                   f"(features: {', '.join(columns)})")
    if len(set(chosen)) != len(chosen):
        raise InvalidSpecError(f"{role} columns repeat a column: {', '.join(chosen)}")
    return chosen
