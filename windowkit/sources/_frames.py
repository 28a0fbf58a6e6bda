"""A pandas DataFrame as a table: its columns, and the index levels named.

A DataFrame often keeps its time (a ``DatetimeIndex``), or its series and
time (a ``MultiIndex``), in its index. An option naming a column may name an
index level instead (``time_col="date"`` for an index named ``date``): that
level is then read as a column. A name found in neither is an error saying
where it was looked for.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from windowkit.errors import SourceError
from windowkit.sources._table_schema import TableOptions

_LISTED = 20  # columns a message lists


def frame_table(frame: Any, name: str, options: TableOptions) -> pa.Table:
    """``frame`` as a pyarrow table of its columns and of the index levels that
    ``options`` name (a column of the same name comes first)."""
    try:
        table = pa.Table.from_pandas(frame, preserve_index=False)
    except (pa.ArrowException, TypeError, ValueError) as exc:
        detail = str(exc.args[-1]) if exc.args else str(exc)
        raise SourceError(f"{name}: a column holds values no table can store "
                          f"({detail}); expected numbers of float16/32/64, int, uint "
                          "or bool, timestamps or text") from exc
    levels = [level for level in frame.index.names if level is not None]
    named: list[tuple[str, str | None]] = [
        ("series", options.series_col), ("time", options.time_col),
        *(("feature", c) for c in options.columns or ()),
        *(("static", c) for c in options.static_columns or ())]
    for label, column in named:
        if column is None or column in table.column_names:
            continue
        if column not in levels:
            raise SourceError(f"{name}: no {label} column {column!r} (columns: "
                              f"{_listed(table.column_names)}; {_index_text(frame, column)})")
        values = frame.index.get_level_values(column)
        try:
            table = table.append_column(column, pa.Array.from_pandas(values))
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise SourceError(f"{name}: index {column!r} holds values no table can store "
                              f"({exc})") from None
    return table


def _listed(names: list[str]) -> str:
    """Column names, the first :data:`_LISTED` of a wide table."""
    return ", ".join(names[:_LISTED]) + (
        f", ... ({len(names)} in all)" if len(names) > _LISTED else "")


def _index_text(frame: Any, column: str) -> str:
    """What a message says of the DataFrame's index: its levels' names, or that
    it has none (and, for a time index, how to name it ``column``)."""
    index = frame.index
    names = [level for level in index.names if level is not None]
    if names:
        label = "index" if index.nlevels == 1 else "index levels"
        return f"{label}: {', '.join(repr(n) for n in names)}"
    kind = type(index).__name__
    hint = (f"; to use it, name it: frame.index.name = {column!r}"
            if kind == "DatetimeIndex" else "")
    return f"index: an unnamed {kind}{hint}"
