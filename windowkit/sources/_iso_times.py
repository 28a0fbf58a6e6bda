"""ISO text times, taken alike from every table source.

A CSV reader recognises ISO dates and timestamps itself; a Parquet or
DataFrame column of text (``2001-01-01T01:00``) reaches staging as strings.
Those are read here, without ``--time-format``: a column whose first batch
holds only dates (``2001-01-31``, or months ``2001-01``, as pandas reads them)
is of dates (days), any other of timestamps (nanoseconds, UTC: a UTC offset
such as ``+02:00`` or ``Z`` is converted).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from windowkit.errors import SourceError

_DATE = r"^\d{4}(-\d{2}){0,2}$"  # a year, a month or a day
_OFFSET = r"(Z|[+-]\d{2}:?\d{2})$"
_FORMAT_HINT = "pass its format with --time-format, e.g. %Y/%m/%d or '%d.%m.%Y %H:%M'"


def iso_times(column: pa.Array, unit: str, where: str,
              row_text: Callable[[int], str]) -> tuple[np.ndarray, str, str | None]:
    """A text column's ISO times as int64, their unit (``unit``, or when it is
    not known yet, days for dates only, else ns) and their zone ("UTC" when
    they carry offsets). A value that is not ISO is an error naming its row."""
    import pandas as pd

    text = column.cast(pa.string())
    parsed = pd.to_datetime(pd.Series(text.to_pandas(), dtype=object), format="ISO8601",
                            utc=True, errors="coerce")
    bad = parsed.isna().to_numpy()
    if bad.any():
        at = int(np.flatnonzero(bad)[0])
        value = text[at].as_py()
        if not unit and at == 0:  # the column's first value
            raise SourceError(f"{where} holds text ({value!r} first), not times; "
                              f"{_FORMAT_HINT} (ISO times such as 2001-01-01T01:00 need none)")
        raise SourceError(f"{row_text(at)}, time {value!r} is not an ISO date or time like "
                          f"the column's first; {_FORMAT_HINT}")
    zone = "UTC" if pc.any(pc.match_substring_regex(text, _OFFSET)).as_py() else None
    dates = pc.all(pc.match_substring_regex(text, _DATE)).as_py()
    unit = unit or ("days" if dates else "ns")
    naive = parsed.dt.tz_localize(None)
    if unit == "days":
        if not dates:
            at = int(np.flatnonzero(~pc.match_substring_regex(text, _DATE).to_numpy(
                zero_copy_only=False))[0])
            raise SourceError(f"{row_text(at)}, time {text[at].as_py()!r} is not a date, "
                              "but the column's first times are dates (2001-01-31 or 2001-01)")
        return naive.to_numpy().astype("datetime64[D]").astype(np.int64), unit, zone
    try:
        return naive.dt.as_unit("ns").to_numpy().astype(np.int64), unit, zone
    except ValueError as exc:  # pandas' OutOfBoundsDatetime
        raise SourceError(f"{where}: a time is outside the years 1678-2261 that "
                          f"timestamps in nanoseconds hold ({exc})") from None
