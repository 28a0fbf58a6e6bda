"""Shards of a split: which windows each one owns, and what each epoch yields.

Shard ``i`` of ``n`` owns the windows at index positions ``[lo, hi)``: the
split's index cut into ``n`` contiguous pieces whose sizes differ by at most
one window. Whatever the mode, a shard's epoch is the epoch's order of the
whole split (a pure function of seed and epoch) restricted to the windows it
owns, so that shards are disjoint and cover the split, and a shard reads only
its own storage blocks (plus at most one boundary block on each side).

Every shard yields the same number of windows an epoch, as
``DistributedSampler`` does: a shard one window short repeats its last one
(at most ``n - 1`` windows repeated an epoch), or, with ``drop_remainder``,
a shard one window long leaves its last one out (at most ``n - 1`` left out).
"""

from __future__ import annotations

import numbers
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from windowkit.errors import InvalidSpecError

#: epoch positions evaluated at once while restricting an epoch's order to a
#: shard (small: the temporaries of a chunk are what restricting costs in memory)
SEQUENCE_CHUNK = 1 << 18


@dataclass(frozen=True, eq=False)
class ShardShare:
    """Shard ``index`` of ``count`` over a split of ``total`` windows; in an
    epoch resumed on another shard count, its piece of the windows left
    (``owned``: their index positions, ascending; ``sizes``: every shard's
    piece size)."""

    index: int = 0
    count: int = 1
    total: int = 0
    owned: np.ndarray | None = None
    sizes: tuple[int, ...] = ()

    @classmethod
    def of(cls, total: int, count: int, index: int, *, where: str) -> ShardShare:
        """The share, or one line naming ``where`` when there are fewer
        windows than shards."""
        if total < count:
            raise InvalidSpecError(
                f"{where} has {total} windows, too few for {count} shards (each shard "
                f"needs at least one); use at most {max(total, 1)} shards")
        return cls(index, count, total)

    @classmethod
    def of_windows(cls, left: np.ndarray, count: int, index: int, total: int) -> ShardShare:
        """Shard ``index`` of ``count`` over the windows ``left`` (index
        positions, ascending) of a split of ``total``: the same contiguous,
        balanced pieces, of those windows. With fewer windows left than
        shards, a shard left without one repeats the last window left (as a
        shard's padding does), so that every shard steps together."""
        pieces = [ShardShare(i, count, len(left)) for i in range(count)]
        mine = pieces[index]
        owned = left[mine.lo:mine.hi] if mine.size or not len(left) else left[-1:]
        return cls(index, count, total, owned, tuple(p.size for p in pieces))

    @property
    def whole(self) -> bool:
        return self.count == 1 and self.owned is None

    @property
    def lo(self) -> int:
        """The index position of the shard's first window."""
        q, r = divmod(self.total, self.count)
        return self.index * q + min(self.index, r)

    @property
    def hi(self) -> int:
        """One past the index position of the shard's last window."""
        q, r = divmod(self.total, self.count)
        return self.lo + q + (1 if self.index < r else 0)

    @property
    def size(self) -> int:
        return self.hi - self.lo if self.owned is None else len(self.owned)

    def windows_per_epoch(self, drop_remainder: bool = False) -> int:
        """Windows every shard yields an epoch: the largest share (padded), or
        with ``drop_remainder`` the smallest (the rest left out)."""
        if self.owned is not None:
            return min(self.sizes) if drop_remainder else max(self.sizes)
        if self.whole:
            return self.total
        q, r = divmod(self.total, self.count)
        return q if drop_remainder or r == 0 else q + 1

    def owns(self, positions: np.ndarray) -> np.ndarray:
        """Which of the index ``positions`` this shard owns (a boolean mask)."""
        if self.owned is None:
            return (positions >= self.lo) & (positions < self.hi)
        at = np.searchsorted(self.owned, positions)
        return (at < len(self.owned)) & (self.owned[np.minimum(at, len(self.owned) - 1)]
                                         == positions)


class ShardSequence:
    """A shard's epoch positions -> the split's index positions.

    ``full(epoch, where)`` is the order of the whole split (index positions
    at epoch positions ``where``); ``ordered`` says it is the identity. A
    shard's sequence is the whole order restricted to the windows it owns:
    computed once an epoch (a pass over the split's order, in chunks) unless
    the order is the identity or the shard is the whole split.
    """

    def __init__(self, share: ShardShare, full: Callable[[int, np.ndarray], np.ndarray], *,
                 ordered: bool) -> None:
        self.share = share
        self._full = full
        self.ordered = ordered
        self._lock = threading.Lock()
        self._cached: tuple[int, np.ndarray] | None = None

    def positions(self, epoch: int, where: np.ndarray) -> np.ndarray:
        """Index positions of the windows at this shard's epoch positions
        ``where``; positions past the shard's own windows repeat its last one."""
        share = self.share
        if share.whole:
            return self._full(epoch, where)
        if share.size == 0:
            raise InvalidSpecError(f"shard {share.index} of {share.count} has no windows "
                                   "left in this epoch")
        where = np.minimum(where, share.size - 1)
        if self.ordered:
            return share.lo + where if share.owned is None else share.owned[where]
        return self.sequence(epoch)[where].astype(np.int64)

    def sequence(self, epoch: int) -> np.ndarray:
        """Every window of the shard in epoch ``epoch``'s order (cached for one
        epoch; int32 where the split's positions fit, half the memory)."""
        with self._lock:
            cached = self._cached
            if cached is not None and cached[0] == epoch:
                return cached[1]
            total = self.share.total
            sequence = np.empty(self.share.size,
                                dtype=np.int32 if total < 2**31 else np.int64)
            filled = 0
            for first in range(0, total, SEQUENCE_CHUNK):
                order = self._full(epoch, np.arange(first, min(first + SEQUENCE_CHUNK, total),
                                                    dtype=np.int64))
                mine = order[self.share.owns(order)]
                sequence[filled:filled + len(mine)] = mine
                filled += len(mine)
            if filled != len(sequence):
                raise AssertionError(f"a shard's order held {filled} windows, "
                                     f"expected {len(sequence)}")
            self._cached = (epoch, sequence)
            return sequence


@dataclass(frozen=True)
class EpochStop:
    """Where an epoch was stopped: ``num_shards`` shards had each read
    ``windows`` windows of their share (ranks step together)."""

    num_shards: int
    windows: int


#: stops a saved position may hold (each one a resume within one epoch)
MAX_STOPS = 1024


def checked_stops(stops: object, total: int) -> tuple[EpochStop, ...]:
    """A saved position's stops (``[shards, windows]`` pairs, untrusted) over a
    split of ``total`` windows, each number bounded; else one line."""
    if not isinstance(stops, list | tuple) or len(stops) > MAX_STOPS:
        raise InvalidSpecError(f"a saved position's stops are a list of at most {MAX_STOPS} "
                               "[shards, windows] pairs")
    checked = []
    for stop in stops:
        if not isinstance(stop, list | tuple) or len(stop) != 2:
            raise InvalidSpecError("a saved position's stops are [shards, windows] pairs, "
                                   f"got {stop!r:.60}")
        checked.append(EpochStop(_bounded("shards", stop[0], 1, max(1, total), total),
                                 _bounded("windows read", stop[1], 0, total, total)))
    return tuple(checked)


def _bounded(what: str, value: object, low: int, high: int, total: int) -> int:
    """A stop's ``value`` if it is an integer in ``[low, high]``, else one line."""
    if (isinstance(value, bool) or not isinstance(value, numbers.Integral)
            or not low <= int(value) <= high):
        raise InvalidSpecError(f"a saved position's stop names {value!r:.40} {what}; a split "
                               f"of {total} windows has {low} to {high}")
    return int(value)


def windows_left(order: Callable[[np.ndarray], np.ndarray], total: int,
                 stops: list[EpochStop]) -> np.ndarray:
    """The index positions (ascending) of the windows an epoch has left after
    ``stops``: each stop's shards owned balanced, contiguous pieces of the
    windows then left, read in the epoch's order (``order(where)``: the index
    positions at epoch positions ``where``), and had read their first
    ``windows`` each. Those of every shard together are left. Vectorized: no
    Python loop over shards."""
    rank = np.empty(total, dtype=np.int64)  # each window's place in the epoch's order
    for first in range(0, total, SEQUENCE_CHUNK):
        where = np.arange(first, min(first + SEQUENCE_CHUNK, total), dtype=np.int64)
        rank[order(where)] = where
    left = np.arange(total, dtype=np.int64)
    for stop in stops:
        if stop.windows == 0 or len(left) == 0:
            continue
        count = min(stop.num_shards, len(left))  # shards past the windows own none
        q, r = divmod(len(left), stop.num_shards)
        shards = np.arange(count + 1, dtype=np.int64)
        bounds = shards * q + np.minimum(shards, r)  # each piece's first place in `left`
        piece = np.repeat(np.arange(count, dtype=np.int64), np.diff(bounds))
        by_piece = np.lexsort((rank[left], piece))  # each piece's windows in epoch order
        read_here = np.arange(len(left), dtype=np.int64) - bounds[piece]  # place in piece
        left = np.sort(left[by_piece[read_here >= stop.windows]])
    return left


def regrouped(state: dict[str, Any], given: object, batch_size: int, total: int
              ) -> dict[str, Any]:
    """The position where a saved state (of a reader of ``state["num_shards"]``
    shards, over a split of ``total`` windows) stands once each shard had been
    given ``given`` batches of ``batch_size`` of its epoch, as the saved reader
    counted them (after its ``lead``): its stops and one more."""
    stops = list(checked_stops(state.get("stops") or [], total))
    shards = _bounded("shards", state.get("num_shards"), 1, max(1, total), total)
    count = _bounded("batches given", given, 0, total, total)
    read = min(max(0, count - saved_lead(state, total)) * batch_size, total)
    stops.append(EpochStop(shards, read))
    return {**state, "stops": [[stop.num_shards, stop.windows] for stop in stops]}


def saved_lead(state: dict[str, Any], total: int) -> int:
    """A saved state's ``lead`` (batches counted before a regrouped epoch's
    first one), bounded by the split's ``total`` windows; 0 when it has none."""
    return _bounded("lead", state.get("lead", 0), 0, total, total)
