"""The options of a conversion: one frozen dataclass, checked once."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from windowkit.errors import InvalidSpecError, check_int
from windowkit.formats import get_format
from windowkit.sources import DEFAULT_SORT_MEMORY, Series, StagedSeries, TableOptions, parse_time
from windowkit.spec import WindowSpec
from windowkit.splits import SPLIT_CONTEXTS, SplitPlan, parse_fractions, split_names_for

DEFAULT_SHARD_BYTES = 64 << 20


@dataclass(frozen=True)
class SplitOptions:
    """How rows are split: by fractions of each series (``by="time"``) or of the
    series (``by="series"``, seeded), or at points in time (``at``)."""

    fractions: dict[str, float] | None = None
    by: str = "time"
    at: str | Sequence[str | int] | None = None
    seed: int = 0
    context: str = "none"  # "history": val/test inputs may come from earlier rows

    def plan(self, series: list[Series]) -> SplitPlan:
        rows = np.array([s.rows for s in series], dtype=np.int64)
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


@dataclass(frozen=True)
class ConvertOptions:
    """Everything a conversion is asked to do (see :func:`windowkit.convert`)."""

    format: str
    window: WindowSpec
    compression: str
    seed: int = 0
    block_rows: int | None = None
    shard_size: int = DEFAULT_SHARD_BYTES
    shards: int | None = None
    workers: int = 1
    dask: Any = None  # a distributed.Client or a scheduler address: shards run there
    overwrite: bool = False
    progress: bool = False
    table: TableOptions = field(default_factory=TableOptions)
    split: SplitOptions = field(default_factory=SplitOptions)
    nan: str = "error"
    target_columns: tuple[str, ...] | None = None
    known_columns: tuple[str, ...] | None = None  # values known over the horizon
    static: Mapping[str, Any] | None = None  # arrays: static name -> a value per series
    sort_memory: int = DEFAULT_SORT_MEMORY

    @classmethod
    def of(cls, *, format: str, window: WindowSpec | int, compression: str | None = None,
           seed: int = 0, splits: str | Mapping[str, float] | None = None,
           split_by: str = "time",
           split_at: str | Sequence[str | int] | None = None, split_context: str = "none",
           table: TableOptions | None = None,
           target_columns: Sequence[str] | None = None,
           known_columns: Sequence[str] | None = None, **rest: object) -> ConvertOptions:
        """The options from :func:`windowkit.convert`'s arguments, checked: one
        clear error for the first one out of range."""
        storage = get_format(format)
        compression = storage.default_compression if compression is None else compression
        if compression not in storage.compressions:
            raise InvalidSpecError(f"compression {compression!r} is not valid for {format}; "
                                   f"expected one of {', '.join(storage.compressions)}")
        if split_by not in ("time", "series"):
            raise InvalidSpecError(f"split_by must be 'time' or 'series', got {split_by!r}")
        if split_context not in SPLIT_CONTEXTS:
            raise InvalidSpecError(f"split_context must be 'none' or 'history', got "
                                   f"{split_context!r}")
        options = cls(
            format=format, compression=compression,
            window=window if isinstance(window, WindowSpec) else WindowSpec(length=window),
            table=table or TableOptions(), seed=seed,
            split=SplitOptions(parse_fractions(splits), split_by, split_at, seed,
                               split_context),
            target_columns=tuple(target_columns) if target_columns else None,
            known_columns=tuple(known_columns) if known_columns else None,
            **rest)  # type: ignore[arg-type]
        for name in ("block_rows", "shard_size", "shards", "workers"):
            if getattr(options, name) is not None:
                check_int(name.replace("_", " "), getattr(options, name), 1)
        if options.nan not in ("error", "skip"):
            raise InvalidSpecError(f"nan must be 'error' or 'skip', got {options.nan!r}")
        return options

    @property
    def skip_missing(self) -> bool:
        return self.nan == "skip"
