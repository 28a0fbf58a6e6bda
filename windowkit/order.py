"""The order in which an epoch visits a split's windows.

Unshuffled, windows come in index order. Shuffled, each epoch draws a seeded
permutation of the storage blocks, takes them ``blocks_per_group`` at a time
and permutes all windows of a group together; batches run on across group
boundaries. Every window appears exactly once per epoch. When one group holds
every block (small stores, or a large enough cache) this is a uniform
permutation of the whole split; otherwise each window is mixed with all the
windows of ``blocks_per_group`` blocks drawn at random from the whole store.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from windowkit.index import WindowRuns


def num_batches(num_windows: int, batch_size: int, drop_remainder: bool) -> int:
    return num_windows // batch_size if drop_remainder else -(-num_windows // batch_size)


def epoch_batches(runs: WindowRuns, *, batch_size: int, shuffle: bool, seed: int, epoch: int,
                  block_rows: int, total_rows: int, blocks_per_group: int,
                  drop_remainder: bool) -> Iterator[np.ndarray]:
    """Yield batches of global window starts (int64) for one epoch."""
    if not shuffle:
        total = runs.total
        stop = total - total % batch_size if drop_remainder else total
        for lo in range(0, stop, batch_size):
            yield runs.global_starts(np.arange(lo, min(lo + batch_size, total)))
        return
    rng = np.random.default_rng([seed, epoch])
    blocks = rng.permutation(-(-total_rows // block_rows))
    carry = np.empty(0, dtype=np.int64)
    for lo in range(0, len(blocks), blocks_per_group):
        group = blocks[lo:lo + blocks_per_group]
        starts = np.concatenate(
            [carry] + [runs.starts_between(b * block_rows, (b + 1) * block_rows) for b in group]
        )
        rng.shuffle(starts[len(carry):])
        full = len(starts) - len(starts) % batch_size
        for i in range(0, full, batch_size):
            yield starts[i:i + batch_size]
        carry = starts[full:]
    if len(carry) and not drop_remainder:
        yield carry
