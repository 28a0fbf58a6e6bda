"""Time columns of tables: their units, parsing text times, split points, steps and gaps.

Integer, date and timestamp columns are kept as int64: days for dates,
nanoseconds since the epoch (UTC) for timestamps, the numbers themselves for
integers. Text times are parsed with strptime codes (``--time-format``), or
without them when ISO (:mod:`._iso_times`).
"""

from __future__ import annotations

import datetime
import itertools
import re
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from windowkit.errors import InvalidSpecError, SourceError

_DAY_NS = 86400 * 10**9
_TIME_CHUNK = 1 << 20  # time differences examined at once
#: strptime codes of a time of day: a format with one parses to timestamps, else dates
CLOCK_DIRECTIVES = ("%H", "%I", "%M", "%S", "%f", "%p", "%z", "%T", "%R", "%c")


#: what a split point on a date or timestamp column may be: a year, a month, an ISO
#: date or date-time, with or without a UTC offset (as pandas reads it)
_ISO_TIME = re.compile(r"\d{4}(-\d{2}(-\d{2}([T ]\d{2}(:\d{2}(:\d{2}(\.\d+)?)?)?"
                       r"\s*(Z|[+-]\d{2}(:?\d{2})?)?)?)?)?")
_INTEGER = re.compile(r"-?\d+")
_POINT_EXAMPLES = "a year such as 2015, or an ISO date or date-time such as 2015-02-06 " \
                  "or 2015-02-06T09:30+01:00"


def point_text(value: object) -> str:
    """A split point as text: ``1995.0`` (a whole float) is ``1995``."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value).strip()


def parse_time(value: object, unit: str) -> int:
    """A time cut point in the time column's int64 units. On a column of plain
    numbers, an integer; on dates and timestamps, a year (its first day: pandas
    reads ``"1995"`` as 1995-01-01), a month or an ISO date or date-time, UTC
    unless it has an offset. On dates, a time of day cuts after that day."""
    text = point_text(value)
    if not unit:
        if _INTEGER.fullmatch(text):
            return int(text)
        raise InvalidSpecError(f"split point {text!r} is not a time of the time column: "
                               "it holds plain numbers, so give integers such as 2015")
    if not _ISO_TIME.fullmatch(text):
        raise InvalidSpecError(f"split point {text!r} is not a time of the time column "
                               f"(dates or timestamps): give {_POINT_EXAMPLES}")
    import pandas as pd

    try:
        stamp = pd.Timestamp(text)
        if stamp.tz is not None:
            stamp = stamp.tz_convert("UTC").tz_localize(None)
        if unit == "ns":
            return int(stamp.as_unit("ns").value)
        day = stamp.normalize()
        days = int(day.to_datetime64().astype("datetime64[D]").astype(np.int64))
        return days + (stamp != day)  # rows before 10:00 on a day include that day
    except (ValueError, OverflowError) as exc:
        raise InvalidSpecError(f"split point {text!r} is not a time the time column can "
                               f"hold ({exc})") from None


def check_split_points(points: Sequence[object]) -> list[str]:
    """Split points as text, checked before any row is read: each an integer or
    an ISO time (:func:`parse_time`), in increasing order."""
    texts = [point_text(p) for p in points]
    if not texts:
        raise InvalidSpecError("--split-at holds no split point")
    unit = "" if all(_INTEGER.fullmatch(t) for t in texts) else "ns"
    cuts = [parse_time(t, unit) for t in texts]
    check_increasing_points(texts, cuts)
    return texts


def check_increasing_points(texts: list[str], cuts: list[int]) -> None:
    """Split points must increase: each split lies after the one before."""
    for k in range(1, len(cuts)):
        if cuts[k] <= cuts[k - 1]:
            raise InvalidSpecError(
                f"split points must increase, but --split-at gives {texts[k]!r} after "
                f"{texts[k - 1]!r}; give them in increasing order")


def duration_text(value: str | int | datetime.timedelta | None) -> str | int | None:
    """A duration object (``pd.Timedelta``, ``datetime.timedelta``,
    ``np.timedelta64``) as the text pandas reads back (``'4 days 00:00:00'``);
    anything else as it is."""
    if isinstance(value, datetime.timedelta | np.timedelta64):
        import pandas as pd

        return str(pd.Timedelta(value))
    return value  # checked by parse_gap


def parse_gap(value: str | int | None, unit: str) -> int | None:
    """``max_gap`` in the time column's int64 units: a whole number of them, or
    for dates and timestamps a duration that pandas reads (``90s``, ``5min``,
    ``1h``, ``2D``, ``3 days``; whole days for dates)."""
    if value is None:
        return None
    text = str(value).strip()
    if isinstance(value, bool) or not text:
        raise InvalidSpecError(f"max gap {value!r} is not a number or a duration")
    try:
        number = float(text)
    except ValueError:
        gap = _duration(text, unit)
    else:
        if unit:
            raise InvalidSpecError(_unitless_gap(text, unit))
        if not number.is_integer():
            raise InvalidSpecError(f"max gap {value!r} is not a whole number; the time "
                                   "column holds plain numbers")
        gap = int(number)
    if gap < 1:
        raise InvalidSpecError(f"max gap must be >= 1, got {value!r}")
    return gap


def _unitless_gap(text: str, unit: str) -> str:
    """Why a bare number is no gap on a date or timestamp column, and what to write."""
    if unit == "days":
        return (f"max gap {text!r} has no unit, and the time column holds dates: write "
                f"its unit, e.g. '{text}D' ({text} days) or '1W'")
    return (f"max gap {text!r} has no unit, and the time column holds timestamps: write "
            f"its unit, e.g. '{text}s', '{text}min', '{text}h' or '{text}D' (pandas "
            "durations: '90s', '16min', '1h', '2D')")


def _duration(text: str, unit: str) -> int:
    """A duration in the time column's units, parsed by pandas."""
    if not unit:
        raise InvalidSpecError(f"max gap {text!r} is not a number or a duration; the time "
                               "column holds plain numbers, so give a whole number")
    import pandas as pd

    # pandas reads "2d" as days, with a warning to write "2D"
    spelled = re.sub(r"(?<=\d)\s*d$", "D", text)
    try:
        nanoseconds = int(pd.Timedelta(spelled).value)
    except ValueError:
        raise InvalidSpecError(f"max gap {text!r} is not a number or a duration "
                               "(examples: 3, 90s, 5min, 1h, 2D)") from None
    if unit == "ns":
        return nanoseconds
    if nanoseconds % _DAY_NS:
        raise InvalidSpecError(f"max gap {text!r} is not a whole number of days, the time "
                               "column's unit")
    return nanoseconds // _DAY_NS


def time_unit(kind: pa.DataType, where: str = "time column") -> tuple[str, str | None]:
    """The int64 unit of a time column of type ``kind`` and its time zone; a
    float column holds plain numbers (whole ones: :func:`float_times`)."""
    if pa.types.is_timestamp(kind):
        return "ns", kind.tz
    if pa.types.is_date(kind):
        return "days", None
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        return "", None
    raise SourceError(f"{where} has type {kind}; expected integers, dates or timestamps "
                      "(text times need --time-format)")


@dataclass(frozen=True)
class TimeKind:
    """How a time column's values become int64 times."""

    unit: str = ""  # "ns" (timestamps, UTC), "days" (dates), "" (plain numbers)
    zone: str | None = None
    text: bool = False  # text (or integers with a format), parsed with --time-format
    floats: bool = False  # floats: whole numbers only


def time_kind(kind: pa.DataType, time_format: str | None, where: str) -> TimeKind:
    """The :class:`TimeKind` of a time column of type ``kind``; text needs
    ``time_format``, whose codes say whether it holds dates or timestamps."""
    text = pa.types.is_string(kind) or pa.types.is_large_string(kind) or (
        pa.types.is_integer(kind) and time_format is not None)  # e.g. 20240131
    if not text and time_format is not None:
        raise InvalidSpecError(f"{where}: --time-format {time_format!r} reads text times, "
                               f"and the time column holds {kind}; leave --time-format out")
    if not text:
        unit, zone = time_unit(kind, where)
        return TimeKind(unit, zone, floats=pa.types.is_floating(kind))
    if time_format:
        clock = any(code in time_format for code in CLOCK_DIRECTIVES)
        return TimeKind("ns" if clock else "days", text=True)
    return TimeKind(text=True)  # ISO text: its unit is known from the first batch


def parse_text_times(column: pa.Array, time_format: str,
                     row_text: Callable[[int], str]) -> pa.Array:
    """Text times parsed with ``--time-format`` (strptime codes) into timestamps;
    a value that does not match is an error naming ``row_text(row)``."""
    column = column.cast(pa.string())
    parsed = pc.strptime(column, format=time_format, unit="ns", error_is_null=True)
    if parsed.null_count:
        at = int(np.flatnonzero(parsed.is_null().to_numpy(zero_copy_only=False))[0])
        raise SourceError(f"{row_text(at)}, time {column[at].as_py()!r} does not "
                          f"match --time-format {time_format!r}")
    return parsed


def float_times(column: pa.Array, where: Callable[[int], str], name: str | None) -> np.ndarray:
    """A float time column's values as int64: whole numbers (``1700.0``, as
    many exports write years) are taken as integers; anything else is an error
    naming the column and ``where(row)``, saying how to cast it."""
    values = column.to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(values) | (values != np.floor(values)) | (np.abs(values) >= 2.0**63)
    if bad.any():
        at = int(np.flatnonzero(bad)[0])
        raise SourceError(
            f"{where(at)}, time column {name!r} holds {values[at].item()!r}, not a whole number; "
            "times must be integers, dates or timestamps: cast the column first (pandas: "
            f"frame[{name!r}] = frame[{name!r}].round().astype('int64'), or "
            f"pd.to_datetime(frame[{name!r}], unit='s') for seconds)")
    return values.astype(np.int64)


def times_int64(column: pa.Array, unit: str) -> np.ndarray:
    if unit == "ns":
        column = column.cast(pa.timestamp("ns", tz=column.type.tz))
        return column.cast(pa.int64()).to_numpy(zero_copy_only=False)
    if unit == "days":
        return column.cast(pa.date32()).cast(pa.int32()).to_numpy(
            zero_copy_only=False).astype(np.int64)
    return column.cast(pa.int64()).to_numpy(zero_copy_only=False)


def _time_chunks(times: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
    """Consecutive time differences, chunk by chunk, as ``(row of each chunk's
    first later time, diffs)``; memory stays bounded."""
    for lo in range(0, len(times) - 1, _TIME_CHUNK):
        yield lo + 1, np.diff(np.asarray(times[lo:lo + _TIME_CHUNK + 1]))


def step_and_segments(times: np.ndarray, max_gap: str | int | None,
                      unit: str) -> tuple[int | None, list[tuple[int, int]]]:
    """A series' regular step (the most common difference; None for one time)
    and its gap-free stretches of rows, in two bounded passes over ``times``."""
    counts: Counter[int] = Counter()
    for _, diffs in _time_chunks(times):
        steps, n = np.unique(diffs, return_counts=True)
        counts.update(dict(zip(steps.tolist(), n.tolist(), strict=True)))
    if not counts:
        return None, [(0, len(times))]
    step = max(counts.items(), key=lambda item: (item[1], -item[0]))[0]
    # calendar steps vary (months of 28-31 days, years of 365-366): a difference
    # is a gap when a sample is missing, i.e. over 1.5 steps
    gap = parse_gap(max_gap, unit) or step * 3 // 2
    breaks = [first + int(i) for first, diffs in _time_chunks(times)
              for i in np.flatnonzero(diffs > gap)]
    return step, list(itertools.pairwise([0, *breaks, len(times)]))
