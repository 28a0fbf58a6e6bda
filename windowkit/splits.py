"""Train/validation/test splits that cannot leak.

A split plan gives every series one contiguous range of rows per split. A
window belongs to a split when all its rows lie in that split's range, so no
row of a validation window ever appears in a training window: windows that
would straddle two ranges are dropped.

- ``by="time"`` (default): each series is cut chronologically by the
  fractions (``train=0.8,val=0.1,test=0.1``: its first 80% of rows, then 10%,
  then 10%).
- ``by="series"``: whole series go to one split, drawn with a seeded
  permutation, in proportion to the fractions.
- ``at=[T1, T2]``: cut points in time (rows before ``T1``, from ``T1`` to
  ``T2``, from ``T2`` on), for sources with a time column.

The split context says what a window of a validation or test split may read:

- ``"none"`` (default): all its rows lie in the split, as above.
- ``"history"`` (forecasting): its *targets* (the horizon's rows) lie in the
  split, and its inputs may come from the rows before, another split's
  included. Training windows still lie wholly in the training rows, so no
  target of a validation or test window is ever in a training window. With no
  horizon it is the same as ``"none"``; with ``by="series"`` it changes
  nothing (a series' rows all lie in one split).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from windowkit.errors import InvalidSpecError

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
SPLIT_CONTEXTS = ("none", "history")


def parse_fractions(value: str | Mapping[str, float] | None) -> dict[str, float] | None:
    """``"train=0.8,val=0.2"`` (or a mapping) as ordered split fractions."""
    if value is None:
        return None
    if isinstance(value, str):
        pairs: list[tuple[str, Any]] = []
        for part in value.split(","):
            name, sep, number = part.partition("=")
            if not sep:
                raise InvalidSpecError(f"split {value!r} does not parse: expected "
                                       "name=fraction pairs such as train=0.8,val=0.2")
            pairs.append((name.strip(), number.strip()))
    else:
        pairs = list(value.items())
    fractions: dict[str, float] = {}
    for name, number in pairs:
        _check_name(name, fractions)
        try:
            fraction = float(number)
        except (TypeError, ValueError):
            raise InvalidSpecError(f"split {name}={number!r}: the fraction is not a number") \
                from None
        if not 0 < fraction <= 1:
            raise InvalidSpecError(f"split {name}={number}: the fraction must be in (0, 1]")
        fractions[str(name)] = fraction
    if sum(fractions.values()) > 1 + 1e-9:
        raise InvalidSpecError(f"split fractions sum to {sum(fractions.values()):g}, over 1")
    return fractions


@dataclass(frozen=True)
class SplitPlan:
    """Row ranges ``ranges[series, split] = (lo, hi)`` for the named splits."""

    names: tuple[str, ...]
    ranges: np.ndarray  # int64 [series, splits, 2]

    @classmethod
    def single(cls, rows: np.ndarray) -> SplitPlan:
        ranges = np.stack([np.zeros_like(rows), rows], axis=-1)[:, None, :]
        return cls(("train",), ranges.astype(np.int64))

    @classmethod
    def chronological(cls, rows: np.ndarray, fractions: dict[str, float]) -> SplitPlan:
        cuts = np.cumsum([0.0, *fractions.values()])
        bounds = np.rint(rows[:, None] * cuts[None, :]).astype(np.int64)
        return cls(tuple(fractions), np.stack([bounds[:, :-1], bounds[:, 1:]], axis=-1))

    @classmethod
    def by_series(cls, rows: np.ndarray, fractions: dict[str, float], seed: int) -> SplitPlan:
        order = np.random.default_rng(seed).permutation(len(rows))
        cuts = np.rint(np.cumsum([0.0, *fractions.values()]) * len(rows)).astype(np.int64)
        ranges = np.zeros((len(rows), len(fractions), 2), dtype=np.int64)
        for k in range(len(fractions)):
            chosen = order[cuts[k]:cuts[k + 1]]
            ranges[chosen, k, 1] = rows[chosen]
        return cls(tuple(fractions), ranges)

    @classmethod
    def at_times(cls, times: Sequence[np.ndarray | None], cuts: Sequence[int],
                 names: Sequence[str]) -> SplitPlan:
        """Rows with time < cuts[0] go to names[0], and so on."""
        ranges = np.zeros((len(times), len(names), 2), dtype=np.int64)
        for s, t in enumerate(times):
            if t is None:
                raise InvalidSpecError("split points in time need a time column (--time-col)")
            bounds = [0, *np.searchsorted(t, cuts, side="left").tolist(), len(t)]
            ranges[s, :, 0], ranges[s, :, 1] = bounds[:-1], bounds[1:]
        return cls(tuple(names), ranges)

    @property
    def train_split(self) -> int:
        """The training split: ``"train"``, else the first."""
        return self.names.index("train") if "train" in self.names else 0

    def train_ranges(self) -> np.ndarray:
        """``[series, 2]`` row ranges whose rows feed the normalization statistics."""
        return np.ascontiguousarray(self.ranges[:, self.train_split, :])

    def window_ranges(self, k: int, *, context: str, history_rows: int) -> np.ndarray:
        """``[series, 2]`` row ranges that split ``k``'s windows lie in: its own
        rows; with ``context="history"`` (a split other than training), also the
        ``history_rows`` rows before them, which only a window's inputs reach
        (``L * sampling_rate``: a window starting there has its first target
        on the split's first row)."""
        ranges = np.array(self.ranges[:, k, :])
        if context == "history" and k != self.train_split and history_rows > 0:
            has_rows = ranges[:, 1] > ranges[:, 0]
            ranges[has_rows, 0] = np.maximum(0, ranges[has_rows, 0] - history_rows)
        return ranges

    def table_columns(self, *, context: str, history_rows: int) -> dict[str, np.ndarray]:
        """``series.parquet`` columns recording, per split, the rows of each series
        its windows lie in (:meth:`window_ranges`): what readers check the index
        tables against (see :func:`window_range_columns`)."""
        out: dict[str, np.ndarray] = {}
        for k, name in enumerate(self.names):
            ranges = self.window_ranges(k, context=context, history_rows=history_rows)
            first, end = window_range_columns(name)
            out[first], out[end] = ranges[:, 0].copy(), ranges[:, 1].copy()
        return out

    def key(self) -> list[Any]:
        return [list(self.names), self.ranges.tolist()]


def window_range_columns(split: str) -> tuple[str, str]:
    """The ``series.parquet`` columns (int64) holding, per series, the first row
    and the end (exclusive) of the rows the windows of ``split`` lie in."""
    return f"split_{split}_first_row", f"split_{split}_end_row"


def history_rows(spec: Any) -> int:
    """Rows before a split that its windows' inputs may reach under the
    ``history`` context (``L * sampling_rate``, with a horizon)."""
    return int(spec.length * spec.sampling_rate) if spec.horizon else 0


def parse_split_names(value: str | Mapping[str, float] | None) -> tuple[str, ...] | None:
    """The names ``--split`` gives the splits that ``--split-at`` makes:
    ``"fit,check,hold"``, names alone (the points cut the rows, so fractions
    would be ignored: they are an error)."""
    if value is None:
        return None
    if not isinstance(value, str) or "=" in value:
        shown = value if isinstance(value, str) else ",".join(f"{k}={v}" for k, v in
                                                               value.items())
        raise InvalidSpecError(
            f"--split {shown} gives fractions, and --split-at cuts at points in time; with "
            "--split-at, --split names the splits alone (e.g. --split train,val,test)")
    names = tuple(name.strip() for name in value.split(","))
    for k, name in enumerate(names):
        _check_name(name, names[:k])
    return names


def _check_name(name: object, before: Collection[str]) -> None:
    """A split's name: a valid one, not among the names ``before`` it."""
    if not _NAME.fullmatch(str(name)):
        raise InvalidSpecError(f"split name {name!r} is not a valid name")
    if name in before:
        raise InvalidSpecError(f"split {name!r} appears twice")


def split_names_for(cuts: int, names: tuple[str, ...] | None) -> tuple[str, ...]:
    """Names of the ``cuts + 1`` splits made by time cut points."""
    if names is not None:
        if len(names) != cuts + 1:
            raise InvalidSpecError(f"{cuts} split points make {cuts + 1} splits, but "
                                   f"{len(names)} split names were given")
        return names
    defaults = ("train", "val", "test")
    if cuts + 1 > len(defaults):
        raise InvalidSpecError(f"{cuts} split points make {cuts + 1} splits: name them "
                               "with --split (e.g. --split a,b,c,d)")
    return defaults[:cuts + 1]
