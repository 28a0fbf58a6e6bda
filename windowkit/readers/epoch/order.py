"""The Keras reader's epoch order, with random access: which windows the epoch
positions of a batch hold.

It follows the sampler (:mod:`windowkit.readers.epoch.sampler`): blocks holding windows of
the split, in the epoch's order, ``blocks_per_group`` at a time, the windows of
a group (its blocks' windows in index order) permuted together with its key
(reads stay local, so the block cache works); batches run on across group
boundaries. Every window appears exactly once per epoch. The permutation within
a group is a keyed bijection (:mod:`windowkit.readers.epoch.permutation`), so the windows at
any epoch positions are computed directly, in any order: an :class:`EpochOrder`
holds a few arrays per storage block, whatever the number of windows.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from windowkit.errors import InvalidSpecError
from windowkit.index import WindowRuns
from windowkit.readers.epoch.permutation import KeyedPermutations
from windowkit.readers.epoch.sampler import Sampler


def num_batches(num_windows: int, batch_size: int, drop_remainder: bool) -> int:
    return num_windows // batch_size if drop_remainder else -(-num_windows // batch_size)


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

    def __init__(self, runs: WindowRuns, *, sampler: Sampler, epoch: int,
                 block_first: np.ndarray) -> None:
        self.runs = runs
        self.total = runs.total
        self.shuffle = sampler.shuffle
        if not self.shuffle:
            return
        order = sampler.block_order(epoch)
        group = np.arange(len(order)) // sampler.group
        self._blocks = order[np.lexsort((order, group))]  # each group's blocks ascending
        counts = np.diff(block_first)[self._blocks]
        self._block_first = block_first
        # epoch position of each visited block's (and group's) first window
        self._slot_first = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        heads = np.append(np.arange(0, len(self._blocks), sampler.group), len(self._blocks))
        self._group_first = self._slot_first[heads]
        self._shuffles = KeyedPermutations(np.diff(self._group_first),
                                           sampler.group_keys(epoch))

    def positions(self, lo: int, hi: int) -> np.ndarray:
        """Index positions (in ``runs``' order) of the windows at epoch positions
        ``[lo, hi)``."""
        if not 0 <= lo <= hi <= self.total:
            raise IndexError(f"epoch positions [{lo}, {hi}) out of range for {self.total} windows")
        return self.positions_at(np.arange(lo, hi, dtype=np.int64))

    def positions_at(self, where: np.ndarray) -> np.ndarray:
        """Index positions of the windows at epoch positions ``where`` (each in
        ``[0, total)``)."""
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

    def batch_with_series(self, index: int, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`batch`, and the series (int32) of each of its windows."""
        lo = index * batch_size
        return self.runs.global_starts_and_series(
            self.positions(lo, min(lo + batch_size, self.total)))


class WindowOrder:
    """Every epoch's window order for one split (seeded; cheap to pickle)."""

    def __init__(self, runs: WindowRuns, *, shuffle: bool, seed: int, block_rows: int,
                 total_rows: int, blocks_per_group: int | Callable[[int], int]) -> None:
        """``blocks_per_group``: a number, or a function of how many blocks
        hold windows of the split."""
        self.runs = runs
        self._block_first = block_first_positions(
            runs, block_rows=block_rows, num_blocks=-(-total_rows // block_rows))
        counts = np.diff(self._block_first)
        group = (blocks_per_group(int(np.count_nonzero(counts))) if callable(blocks_per_group)
                 else blocks_per_group)
        self.sampler = Sampler(counts, group=group, shuffle=shuffle, seed=seed)

    @property
    def total(self) -> int:
        return self.runs.total

    def epoch(self, epoch: int) -> EpochOrder:
        """The order of epoch ``epoch`` (0, 1, ...); the same seed gives the same one."""
        if epoch < 0:
            raise InvalidSpecError(f"epoch must be >= 0, got {epoch}")
        return EpochOrder(self.runs, sampler=self.sampler, epoch=epoch,
                          block_first=self._block_first)
