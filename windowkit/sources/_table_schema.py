"""What a table's header and column types say, checked before any row is staged.

The options name the series, time, feature and static columns; the schema
must hold them, each named once and sensibly, with numeric features and
static values. The outcome, :class:`TableColumns`, is all that staging needs
to know of the schema: the feature columns, their common dtype and how the
time column becomes int64 times.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from windowkit.errors import SourceError
from windowkit.sources._times import TimeKind, time_kind

_MAX_NAME = 256  # characters of a column name a store's manifest holds
_LISTED = 20  # columns a message lists (a wide table has thousands)


@dataclass(frozen=True)
class TableOptions:
    """How to read a table: which column names the series, which the time, and
    which are features (default: every other column)."""

    series_col: str | None = None
    time_col: str | None = None
    columns: tuple[str, ...] | None = None
    max_gap: str | int | None = None
    time_format: str | None = None  # strptime codes for a text time column
    static_columns: tuple[str, ...] | None = None  # one value per series, not features
    dtype: str | None = None  # the values' dtype (cast, checked), else the columns' own
    header: bool = True  # a CSV's first line names its columns (else "0", "1", ...)


@dataclass(frozen=True)
class TableColumns:
    """The checked schema: feature columns, the values' dtype, the time column's kind."""

    features: tuple[str, ...]
    dtype: np.dtype
    time: TimeKind


def read_schema(name: str, options: TableOptions, schema: pa.Schema) -> TableColumns:
    """Check the table ``name``'s schema against ``options``; the columns to stage."""
    names = schema.names
    _check_present(name, options, names)
    _check_roles(name, options)
    _check_static(name, options, schema)
    static = list(options.static_columns or ())
    skip = {options.series_col, options.time_col, *static}
    features = list(options.columns) if options.columns else [
        n for n in names if n not in skip]
    _check_names(name, names, {*skip, *features} - {None})
    for label, chosen in (("--columns", features), ("--static-columns", static)):
        repeated = sorted(c for c, times in Counter(chosen).items() if times > 1)
        if repeated:
            raise SourceError(f"{name}: {label} names {repeated[0]!r} more than "
                              "once; name each column once")
    if not features:
        raise SourceError(f"{name}: no feature columns")
    dtype = _values_dtype(name, schema, features, options.dtype)
    time = TimeKind()
    if options.time_col is not None:
        time = time_kind(schema.field(options.time_col).type, options.time_format,
                         f"{name}: time column {options.time_col!r}")
    return TableColumns(tuple(features), dtype, time)


def _check_present(name: str, options: TableOptions, names: list[str]) -> None:
    """Every column the options name is in the table."""
    present = set(names)
    for label, column in (("series", options.series_col), ("time", options.time_col),
                          *(("feature", c) for c in options.columns or ()),
                          *(("static", c) for c in options.static_columns or ())):
        if column is not None and column not in present:
            listed = ", ".join(names[:_LISTED]) + (
                f", ... ({len(names)} in all)" if len(names) > _LISTED else "")
            raise SourceError(f"{name}: no {label} column {column!r} (columns: {listed})")


def _check_roles(name: str, options: TableOptions) -> None:
    """A column has one role: the series, the time or a feature."""
    series, time = options.series_col, options.time_col
    if series is not None and series == time:
        raise SourceError(f"{name}: column {series!r} is both the series column "
                          "(--series-col) and the time column (--time-col); give each "
                          "column one role")
    for column in options.columns or ():
        if column in (series, time):
            role, flag = (("the series", "--series-col") if column == series
                          else ("the time", "--time-col"))
            raise SourceError(f"{name}: column {column!r} is both a feature column "
                              f"(--columns) and {role} column ({flag}); give each column "
                              "one role")


def _check_names(name: str, names: list[str], used: set[str | None]) -> None:
    """The columns used must have a name, at most 256 characters, found once
    (counted once, so a header of any width is checked in linear time)."""
    hint = ", or choose the columns to use with --columns"
    counts = Counter(names)
    for position, column in enumerate(names):
        if column not in used:
            continue
        if not column.strip():
            raise SourceError(f"{name}: column {position} (counting from 0) has no "
                              f"name in the header: name it{hint}")
        if len(column) > _MAX_NAME:
            raise SourceError(f"{name}: column {position} has a name of {len(column)} "
                              f"characters, over {_MAX_NAME}: rename it{hint}")
        if counts[column] > 1:
            raise SourceError(f"{name}: column name {column!r} appears "
                              f"{counts[column]} times in the header; column names "
                              f"must be unique: rename one{hint}")


def _check_static(name: str, options: TableOptions, schema: pa.Schema) -> None:
    """Static columns: numeric, and neither the series, time nor a feature column."""
    for column in options.static_columns or ():
        if column in (options.series_col, options.time_col) or column in (options.columns or ()):
            role = ("the series" if column == options.series_col else "the time"
                    if column == options.time_col else "a feature")
            raise SourceError(f"{name}: static column {column!r} is also {role} "
                              "column; a static column holds one value per series")
        kind = schema.field(column).type
        if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)
                or pa.types.is_boolean(kind)):
            raise SourceError(f"{name}: static column {column!r} is not numeric "
                              f"({kind})")


def _values_dtype(name: str, schema: pa.Schema, features: list[str],
                  asked: str | None) -> np.dtype:
    """The staged values' dtype: ``asked`` (``--dtype``), else the feature
    columns' common one (booleans as uint8, empty columns as float32)."""
    types = dict(zip(schema.names, schema.types, strict=True))  # the features' names are unique
    distinct = set(types[column] for column in features)  # each type checked once
    bad = {kind for kind in distinct if not (
        pa.types.is_integer(kind) or pa.types.is_floating(kind)
        or pa.types.is_boolean(kind) or pa.types.is_null(kind))}
    if bad:
        column = next(c for c in features if types[c] in bad)
        raise SourceError(f"{name}: column {column!r} is not numeric ({types[column]}); "
                          "pass the feature columns with --columns")
    dtype = np.result_type(*(np.dtype(kind.to_pandas_dtype()) if not pa.types.is_null(kind)
                             else np.dtype(np.float32) for kind in distinct))
    if dtype.kind == "b":
        dtype = np.dtype(np.uint8)
    if asked is not None:
        dtype = np.dtype(asked)
    return dtype
