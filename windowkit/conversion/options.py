"""The options of a conversion: one frozen dataclass, checked once."""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import numbers
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from windowkit.errors import InvalidSpecError, WindowkitError, check_int
from windowkit.formats import get_format
from windowkit.sources import (
    DEFAULT_SORT_MEMORY,
    Series,
    StagedSeries,
    TableOptions,
    check_increasing_points,
    check_split_points,
    parse_time,
    point_text,
)
from windowkit.spec import WindowSpec
from windowkit.splits import (
    SPLIT_CONTEXTS,
    SplitPlan,
    parse_fractions,
    parse_split_names,
    split_names_for,
)

DEFAULT_PART_BYTES = 64 << 20  # raw bytes of rows per part (data file)


@dataclass(frozen=True)
class SplitOptions:
    """How rows are split: by fractions of each series (``by="time"``) or of the
    series (``by="series"``, seeded), or at points in time (``at``)."""

    fractions: dict[str, float] | None = None
    by: str = "time"
    at: str | Sequence[str | int] | None = None
    seed: int = 0
    context: str = "none"  # "history": val/test inputs may come from earlier rows
    names: tuple[str, ...] | None = None  # of the splits ``at`` makes (default train, val, test)

    def plan(self, series: list[Series]) -> SplitPlan:
        rows = np.array([s.rows for s in series], dtype=np.int64)
        if self.at is not None:
            points = split_points(self.at)
            unit = getattr(series[0], "time_unit", "")
            cuts = [parse_time(p, unit) for p in points]  # in the time column's own kind
            check_increasing_points(points, cuts)
            names = split_names_for(len(cuts), self.names)
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
    part_size: int = DEFAULT_PART_BYTES
    parts: int | None = None
    workers: int = 1
    dask: Any = None  # a distributed.Client or a scheduler address: parts run there
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
        _check_split_options(splits, split_by, split_at)
        options = cls(
            format=format, compression=compression,
            window=window if isinstance(window, WindowSpec) else WindowSpec(length=window),
            table=table or TableOptions(), seed=seed,
            split=SplitOptions(None, split_by, split_at, seed, split_context,
                               parse_split_names(splits)) if split_at is not None else
            SplitOptions(parse_fractions(splits), split_by, split_at, seed, split_context),
            target_columns=tuple(target_columns) if target_columns else None,
            known_columns=tuple(known_columns) if known_columns else None,
            **rest)  # type: ignore[arg-type]
        for name in ("block_rows", "part_size", "parts", "workers"):
            if getattr(options, name) is not None:
                check_int(name.replace("_", " "), getattr(options, name), 1)
        if options.nan not in ("error", "skip"):
            raise InvalidSpecError(f"nan must be 'error' or 'skip', got {options.nan!r}")
        _check_time_options(options)
        return options

    @property
    def skip_missing(self) -> bool:
        return self.nan == "skip"


def _check_split_options(splits: object, split_by: str, split_at: object) -> None:
    """Split options that contradict each other (or one that would do
    nothing) are one line naming both."""
    if split_by != "series":
        return
    if split_at is not None:
        raise InvalidSpecError(
            "--split-by series and --split-at contradict each other: --split-at cuts every "
            "series at the same times, --split-by series puts each whole series in one "
            "split; give one of them")
    if splits is None:
        raise InvalidSpecError("--split-by series needs --split, the share of the series "
                               "each split holds (e.g. train=0.8,val=0.2)")


def split_points(at: object) -> list[str]:
    """``split_at`` as a list of points: ``"2015,2018"``, one point, or a list."""
    if isinstance(at, str):
        return [p.strip() for p in at.split(",")]
    if isinstance(at, Sequence):
        return [point_text(p) for p in at]
    return [point_text(at)]  # an integer, a date, a datetime64


def _check_time_options(options: ConvertOptions) -> None:
    """Options that need a time column are given with one, and split points
    parse and increase: one line before any row is read."""
    if options.table.time_col is None:
        if options.split.at is not None:
            raise InvalidSpecError(
                "split points in time need a time column: --split-at cuts at years, dates "
                "or times (e.g. 2015-02-06) of the column that --time-col names; give it")
        if options.table.max_gap is not None:
            raise InvalidSpecError("--max-gap needs a time column: gaps are measured "
                                   "between the times of the column that --time-col "
                                   "names; give it")
    if options.split.at is not None:
        check_split_points(split_points(options.split.at))


# -- the arguments of windowkit.convert, as Python passes them ---------------------

_NONE = type(None)
_INT = (numbers.Integral,)
_COLUMNS = (str, numbers.Integral, Sequence, _NONE)
#: each argument's accepted types and how an error describes them
_ARGUMENT_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "out": ((str, os.PathLike), "a path or URL"),
    "format": ((str,), "a format name (tfrecord, zarr, parquet)"),
    "compression": ((str, _NONE), "a string or None"),
    "seed": (_INT, "an integer"),
    "block_rows": ((*_INT, _NONE), "an integer or None"),
    "part_size": (_INT, "an integer (bytes)"),
    "parts": ((*_INT, _NONE), "an integer or None"),
    "shard_size": ((*_INT, _NONE), "an integer (bytes) or None"),  # part_size's old name
    "shards": ((*_INT, _NONE), "an integer or None"),  # parts' old name
    "workers": (_INT, "an integer"),
    "overwrite": ((bool, np.bool_), "True or False"),
    "progress": ((bool, np.bool_), "True or False"),
    "series_col": ((str, Sequence, _NONE), "a column name or None"),
    "time_col": ((str, Sequence, _NONE), "a column name or None"),
    "columns": (_COLUMNS, "a column name, a list of them or None"),
    "max_gap": ((str, *_INT, datetime.timedelta, _NONE),
                "a number, a duration such as '5min' or pd.Timedelta('5min'), or None"),
    "splits": ((str, Mapping, _NONE), "a dict such as {'train': 0.8, 'val': 0.2}, a string "
               "such as 'train=0.8,val=0.2' (with split_at: names alone, 'fit,check,hold'), "
               "or None"),
    "split_by": ((str,), "'time' or 'series'"),
    "split_at": ((str, *_INT, Sequence, datetime.date, np.datetime64, _NONE),
                 "a time, a list of times or None"),
    "split_context": ((str,), "'none' or 'history'"),
    "nan": ((str,), "'error' or 'skip'"),
    "target_columns": (_COLUMNS, "a column name, a list of them or None"),
    "known_columns": (_COLUMNS, "a column name, a list of them or None"),
    "static_columns": (_COLUMNS, "a column name, a list of them or None"),
    "static": ((Mapping, _NONE), "a dict of a static feature's name to one value per "
               "series, or None"),
    "sort_memory": (_INT, "an integer (bytes)"),
    "time_format": ((str, _NONE), "strptime codes such as '%Y-%m-%d', or None"),
    "storage_options": ((Mapping, _NONE), "a dict or None"),
}


def check_arguments(arguments: Mapping[str, Any]) -> None:
    """Each of :func:`windowkit.convert`'s ``arguments`` of a type it takes:
    else an :class:`InvalidSpecError` naming the argument (``normalize`` of a
    store's readers, ``overwrite`` here: True or False, never a string)."""
    for name, (types, expected) in _ARGUMENT_TYPES.items():
        value = arguments.get(name)
        wrong = not isinstance(value, types) or (
            isinstance(value, bool) and bool not in types and np.bool_ not in types)
        if name in arguments and wrong:
            raise InvalidSpecError(f"{name} must be {expected}, got {value!r} "
                                   f"({type(value).__name__})")
    for name, minimum in (("seed", 0), ("sort_memory", 0)):
        check_int(name, arguments.get(name, minimum), minimum)


def part_options(part_size: int, parts: int | None, shard_size: int | None,
                 shards: int | None) -> tuple[int, int | None]:
    """``part_size`` and ``parts``, either given by their old names
    (``shard_size``, ``shards``: data files were once called shards), not both."""
    if shard_size is not None:
        if part_size not in (DEFAULT_PART_BYTES, shard_size):
            raise InvalidSpecError("--part-size and --shard-size (its old name) are both "
                                   "given; give --part-size only")
        part_size = check_int("shard size", shard_size, 1)
    if shards is not None:
        if parts not in (None, shards):
            raise InvalidSpecError("--parts and --shards (its old name) are both given; "
                                   "give --parts only")
        parts = check_int("shards", shards, 1)
    return part_size, parts


def column_names(name: str, value: Any) -> tuple[Any, ...] | None:
    """A list of columns as given: a string (or a position) is one column, never
    its letters; a list, each of its items. Empty or None: None."""
    if value is None:
        return None
    if isinstance(value, (str, numbers.Integral)) and not isinstance(value, bool):
        return (value,)
    items = tuple(value)
    bad = [item for item in items if isinstance(item, bool) or not isinstance(
        item, (str, numbers.Integral))]
    if bad:
        raise InvalidSpecError(f"{name} must name columns (strings, or positions for "
                               f"arrays), got {bad[0]!r} in {value!r}")
    return items or None


def one_column(name: str, value: Any) -> str | None:
    """The series or time column: a name, or a list holding one name."""
    if value is None or isinstance(value, str):
        return value
    items = column_names(name, value)
    if items is None or len(items) != 1 or not isinstance(items[0], str):
        raise InvalidSpecError(f"{name} takes one column name, got {value!r}")
    return items[0]


def table_dtype(value: Any) -> str | None:
    """The dtype a table's values are stored in (``dtype=``, ``--dtype``): a
    float or integer dtype, or None (the columns' own)."""
    if value is None:
        return None
    try:
        dtype = np.dtype(value)
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind not in "fiu" or dtype.itemsize > 8 or isinstance(value, bool):
        raise InvalidSpecError(f"--dtype must be a float or integer dtype (float16, float32, "
                               f"float64, int8 .. int64, uint8 .. uint64), got {value!r}")
    return dtype.name


def window_spec(window: Any, stride: Any, sampling_rate: Any, horizon: Any) -> WindowSpec:
    """The window, given as a :class:`WindowSpec` or as keywords (``window=32,
    stride=2, horizon=3``), never both."""
    given = {name: value for name, value in (("stride", stride),
             ("sampling_rate", sampling_rate), ("horizon", horizon)) if value is not None}
    if isinstance(window, WindowSpec):
        if given:
            verb = "is" if len(given) == 1 else "are"
            raise InvalidSpecError(
                f"window is a WindowSpec and {', '.join(given)} {verb} given too; give the "
                "window once: window=WindowSpec(32, stride=2, horizon=3), or window=32, "
                "stride=2, horizon=3")
        return window
    check_int("window", window, 1)
    for name, value in given.items():
        check_int(name, value, 0 if name == "horizon" else 1)
    return WindowSpec(length=int(window), **given)


# -- errors: the CLI names its flags, Python its arguments --------------------------

_CLI = contextvars.ContextVar("windowkit_cli_spelling", default=False)
_FLAGS = ("columns", "static-columns", "target-columns", "known-columns", "time-col",
          "series-col", "time-format", "max-gap", "sort-memory", "workers", "part-size",
          "shard-size", "block-rows", "parts", "shards", "split", "split-at", "split-by",
          "split-context", "nan", "format", "compression", "dtype", "out", "window", "stride",
          "sampling-rate", "horizon", "overwrite", "dask", "seed")
_FLAG = r"(?<![^\s(\[])--"  # at the start, after a space or a bracket
_RULES: list[tuple[re.Pattern[str], Any]] = [(re.compile(pattern), to) for pattern, to in (
    (rf" \({_FLAG}overwrite\)", ""),
    (rf"{_FLAG}overwrite\b", "overwrite=True"),
    (rf"{_FLAG}(nan|format|split-by|split-context|compression|dtype) (error|skip|tfrecord|"
     r"zarr|parquet|time|series|none|history|zstd|gzip|(?:u?int|float)\d+)\b",
     lambda m: f'{m[1].replace("-", "_")}="{m[2]}"'),
    (rf"{_FLAG}horizon H\b", "horizon=H"),
    (rf"{_FLAG}time-format '", "time_format='"),
    (rf"{_FLAG}sort-memory ([\d.]+ \w+)", r"sort_memory=\1"),
    (rf"{_FLAG}dask (\S+):", r'dask="\1":'),
    (rf"{_FLAG}(out|split) ([^\s)]+)", lambda m: f'{_python_name(m[1])}="{m[2]}"'),
    (rf"{_FLAG}({'|'.join(sorted(_FLAGS, key=len, reverse=True))})(?![\w-])",
     lambda m: _python_name(m[1])),
)]


def _python_name(flag: str) -> str:
    return "splits" if flag == "split" else flag.replace("-", "_")


def python_spelling(message: str) -> str:
    """An error message with the CLI's flags (``--nan skip``) spelled as the
    Python arguments (``nan="skip"``)."""
    for pattern, to in _RULES:
        message = pattern.sub(to, message)
    return message


@contextlib.contextmanager
def cli_spelling() -> Iterator[None]:
    """Inside (the CLI), errors keep naming the command line's flags."""
    token = _CLI.set(True)
    try:
        yield
    finally:
        _CLI.reset(token)


@contextlib.contextmanager
def python_errors() -> Iterator[None]:
    """A windowkit error raised inside names Python arguments, not CLI flags
    (unless the CLI is the caller: :func:`cli_spelling`)."""
    try:
        yield
    except WindowkitError as exc:
        if not _CLI.get() and len(exc.args) == 1 and isinstance(exc.args[0], str):
            exc.args = (python_spelling(exc.args[0]),)
        raise
