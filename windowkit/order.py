"""The order in which an epoch visits a split's windows, with random access.

Unshuffled, windows come in index order. Shuffled, each epoch draws a seeded
permutation of the storage blocks, takes them ``blocks_per_group`` at a time
and permutes all windows of a group together (reads stay local, so the block
cache works); batches run on across group boundaries. Every window appears
exactly once per epoch. When one group holds every block (small stores, or a
large enough cache) the whole split is mixed; otherwise each window is mixed
with all the windows of ``blocks_per_group`` blocks drawn at random.

The permutation within a group is a keyed pseudo-random bijection of
``[0, size)`` (a Feistel network with cycle walking, as in
``tf.random.experimental.index_shuffle`` and grain's index sampler), so the
windows at any epoch positions are computed directly, in any order, with no
permutation of the epoch's windows in memory: an :class:`EpochOrder` holds a
few arrays per storage block, whatever the number of windows.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from windowkit.errors import InvalidSpecError
from windowkit.index import WindowRuns

_ROUNDS = 4  # Feistel rounds, each part twice (Luby-Rackoff: a pseudo-random permutation)
_GOLDEN = 0x9E3779B97F4A7C15  # 2**64 / golden ratio: spreads consecutive keys
_ODD = np.uint64(0xD6E8FEB86659FD93)  # multiplier of the round hash
_FOLD = np.uint64(32)


def num_batches(num_windows: int, batch_size: int, drop_remainder: bool) -> int:
    return num_windows // batch_size if drop_remainder else -(-num_windows // batch_size)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, a bijective 64-bit hash (uint64 arrays, wrapping)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _feistel(x: np.ndarray, low_bits: np.ndarray, high_mask: np.ndarray, low_mask: np.ndarray,
             keys: np.ndarray) -> np.ndarray:
    """One pass of a Feistel network over ``[0, 2**bits)`` (uint64): the high and
    low bits take turns to be xored with a keyed hash of the other part."""
    high, low = x >> low_bits, x & low_mask
    for i, key in enumerate(keys):  # hash: multiply by an odd constant, fold the high half
        if i % 2:
            f = (high ^ key) * _ODD
            low = low ^ ((f ^ (f >> _FOLD)) & low_mask)
        else:
            f = (low ^ key) * _ODD
            high = high ^ ((f ^ (f >> _FOLD)) & high_mask)
    return (high << low_bits) | low


class KeyedPermutations:
    """Pseudo-random permutations, the ``i``-th of ``[0, size[i])`` keyed by ``key[i]``.

    A Feistel network permutes ``[0, 2**bits)``, the smallest such range (at
    least 4) holding ``size``; cycle walking (apply again while outside)
    restricts it to ``[0, size)``.
    """

    def __init__(self, size: ArrayLike, key: ArrayLike) -> None:
        self.size = np.atleast_1d(np.asarray(size, dtype=np.int64))
        key = np.broadcast_to(np.asarray(key, dtype=np.uint64), self.size.shape)
        bits = np.maximum(2, np.frexp(np.maximum(self.size - 1, 1).astype(np.float64))[1])
        one = np.uint64(1)
        self._low_bits = (bits - bits // 2).astype(np.uint64)
        self._low_mask = (one << self._low_bits) - one
        self._high_mask = (one << (bits // 2).astype(np.uint64)) - one
        self._keys = np.stack(  # [rounds, permutations]
            [_mix(key + np.uint64(_GOLDEN * (r + 1) % 2**64)) for r in range(_ROUNDS)])

    def __call__(self, index: np.ndarray, which: np.ndarray) -> np.ndarray:
        """Where permutation ``which[j]`` sends ``index[j]`` (1-D int arrays)."""
        size = self.size[which]
        if len(index) and ((index < 0) | (index >= size)).any():
            raise ValueError("every index must lie in [0, size) of its permutation")
        limit = size.astype(np.uint64)
        params = (self._low_bits[which], self._high_mask[which], self._low_mask[which],
                  self._keys[:, which])
        out = _feistel(index.astype(np.uint64), *params)
        todo = np.flatnonzero(out >= limit)
        while len(todo):  # cycle walking ends: index's own cycle enters [0, size)
            again = _feistel(out[todo], *(p[..., todo] for p in params))
            out[todo] = again
            todo = todo[again >= limit[todo]]
        return out.astype(np.int64)


def index_shuffle(index: ArrayLike, size: ArrayLike, key: ArrayLike) -> np.ndarray:
    """Where a keyed pseudo-random permutation of ``[0, size)`` sends ``index``
    (elementwise over 1-D ``index``; ``size`` and uint64 ``key`` broadcast)."""
    index = np.atleast_1d(np.asarray(index, dtype=np.int64))
    size = np.broadcast_to(np.asarray(size, dtype=np.int64), index.shape)
    key = np.broadcast_to(np.asarray(key, dtype=np.uint64), index.shape)
    return KeyedPermutations(size, key)(index, np.arange(len(index)))


def block_first_positions(runs: WindowRuns, *, block_rows: int, num_blocks: int) -> np.ndarray:
    """Index position of the first window starting in each block, plus the total
    (``[num_blocks + 1]``): block ``b`` holds positions ``out[b]:out[b + 1]``."""
    bounds = np.arange(num_blocks + 1, dtype=np.int64) * block_rows
    if runs.total == 0:
        return np.zeros(num_blocks + 1, dtype=np.int64)
    gfirst = runs.global_first
    before = np.searchsorted(gfirst, bounds, side="left")  # runs starting below each bound
    run = np.maximum(before - 1, 0)
    inside = np.clip(-((gfirst[run] - bounds) // runs.stride), 0, runs.count[run])
    out = np.where(before > 0, runs.cumulative[run] + inside, 0)
    return out.astype(np.int64)


class EpochOrder:
    """One epoch's order: which windows the epoch positions ``[lo, hi)`` hold."""

    def __init__(self, runs: WindowRuns, *, shuffle: bool, seed: int, epoch: int,
                 block_first: np.ndarray, blocks_per_group: int) -> None:
        self.runs = runs
        self.total = runs.total
        self.shuffle = shuffle
        if not shuffle:
            return
        rng = np.random.default_rng([seed, epoch])
        num_blocks = len(block_first) - 1
        self._blocks = rng.permutation(num_blocks)
        counts = np.diff(block_first)[self._blocks]
        self._block_first = block_first
        # epoch position of each permuted block's (and group's) first window
        self._slot_first = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        heads = np.append(np.arange(0, num_blocks, blocks_per_group), num_blocks)
        self._group_first = self._slot_first[heads]
        key = rng.integers(0, 2**64, dtype=np.uint64, endpoint=False)
        groups = np.arange(len(heads) - 1, dtype=np.uint64)
        self._shuffles = KeyedPermutations(np.diff(self._group_first),
                                           _mix(key + np.uint64(_GOLDEN) * groups))

    def positions(self, lo: int, hi: int) -> np.ndarray:
        """Index positions (in ``runs``' order) of the windows at epoch positions
        ``[lo, hi)``."""
        if not 0 <= lo <= hi <= self.total:
            raise IndexError(f"epoch positions [{lo}, {hi}) out of range for {self.total} windows")
        where = np.arange(lo, hi, dtype=np.int64)
        if not self.shuffle:
            return where
        group = np.searchsorted(self._group_first, where, side="right") - 1
        first = self._group_first[group]
        shuffled = first + self._shuffles(where - first, group)
        slot = np.searchsorted(self._slot_first, shuffled, side="right") - 1
        return self._block_first[self._blocks[slot]] + (shuffled - self._slot_first[slot])

    def starts(self, lo: int, hi: int) -> np.ndarray:
        """Global start rows (int64) of the windows at epoch positions ``[lo, hi)``."""
        return self.runs.global_starts(self.positions(lo, hi))

    def batch(self, index: int, batch_size: int) -> np.ndarray:
        """Global start rows of batch ``index`` (the last one may be short)."""
        lo = index * batch_size
        return self.starts(lo, min(lo + batch_size, self.total))


class WindowOrder:
    """Every epoch's window order for one split (seeded; cheap to pickle)."""

    def __init__(self, runs: WindowRuns, *, shuffle: bool, seed: int, block_rows: int,
                 total_rows: int, blocks_per_group: int) -> None:
        if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
            raise InvalidSpecError(f"seed must be an integer >= 0, got {seed!r}")
        if blocks_per_group < 1:
            raise InvalidSpecError(f"blocks_per_group must be >= 1, got {blocks_per_group}")
        self.runs = runs
        self.shuffle = shuffle
        self.seed = int(seed)
        self.blocks_per_group = blocks_per_group
        self._block_first = block_first_positions(
            runs, block_rows=block_rows, num_blocks=-(-total_rows // block_rows))

    @property
    def total(self) -> int:
        return self.runs.total

    def epoch(self, epoch: int) -> EpochOrder:
        """The order of epoch ``epoch`` (0, 1, ...); the same seed gives the same one."""
        if epoch < 0:
            raise InvalidSpecError(f"epoch must be >= 0, got {epoch}")
        return EpochOrder(self.runs, shuffle=self.shuffle, seed=self.seed, epoch=epoch,
                          block_first=self._block_first,
                          blocks_per_group=self.blocks_per_group)
