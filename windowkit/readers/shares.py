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

import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from windowkit.errors import InvalidSpecError

#: epoch positions evaluated at once while restricting an epoch's order to a shard
SEQUENCE_CHUNK = 1 << 20


@dataclass(frozen=True)
class ShardShare:
    """Shard ``index`` of ``count`` over a split of ``total`` windows."""

    index: int = 0
    count: int = 1
    total: int = 0

    @classmethod
    def of(cls, total: int, count: int, index: int, *, where: str) -> ShardShare:
        """The share, or one line naming ``where`` when there are fewer
        windows than shards."""
        if total < count:
            raise InvalidSpecError(
                f"{where} has {total} windows, too few for {count} shards (each shard "
                f"needs at least one); use at most {max(total, 1)} shards")
        return cls(index, count, total)

    @property
    def whole(self) -> bool:
        return self.count == 1

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
        return self.hi - self.lo

    def windows_per_epoch(self, drop_remainder: bool = False) -> int:
        """Windows every shard yields an epoch: the largest share (padded), or
        with ``drop_remainder`` the smallest (the rest left out)."""
        if self.whole:
            return self.total
        q, r = divmod(self.total, self.count)
        return q if drop_remainder or r == 0 else q + 1


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
        self._ordered = ordered
        self._lock = threading.Lock()
        self._cached: tuple[int, np.ndarray] | None = None

    def positions(self, epoch: int, where: np.ndarray) -> np.ndarray:
        """Index positions of the windows at this shard's epoch positions
        ``where``; positions past the shard's own windows repeat its last one."""
        share = self.share
        if share.whole:
            return self._full(epoch, where)
        where = np.minimum(where, share.size - 1)
        if self._ordered:
            return share.lo + where
        return self.sequence(epoch)[where]

    def sequence(self, epoch: int) -> np.ndarray:
        """Every window of the shard in epoch ``epoch``'s order (cached for one epoch)."""
        with self._lock:
            cached = self._cached
            if cached is not None and cached[0] == epoch:
                return cached[1]
            lo, hi, total = self.share.lo, self.share.hi, self.share.total
            pieces = []
            for first in range(0, total, SEQUENCE_CHUNK):
                order = self._full(epoch, np.arange(first, min(first + SEQUENCE_CHUNK, total),
                                                    dtype=np.int64))
                pieces.append(order[(order >= lo) & (order < hi)])
            sequence = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
            self._cached = (epoch, sequence)
            return sequence
