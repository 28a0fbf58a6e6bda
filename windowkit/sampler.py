"""The sampler: the one epoch order every reader follows.

Only the storage blocks holding windows of the split take part (a small split
never mixes its windows with blocks that hold none). Unshuffled, blocks come in
store order and windows in index order. Shuffled, each epoch visits those blocks
in a keyed pseudo-random order and takes them ``group`` at a time; the windows
of a group are permuted together, with a key of their own. Orders are pure
functions of ``(seed, epoch, position)``: nothing is drawn from a stateful
generator, so a reader's state is a few integers, and any position of any
epoch is computed directly.

The Keras reader (:class:`windowkit.readers.EpochOrder`) permutes a group's
windows with the same keyed permutation; the ``tf.data`` readers permute them
in the graph (``stateless_shuffle`` seeded with the group's key). Either way a
window's batch-mates come from the ``group`` blocks of its group.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from windowkit.errors import InvalidSpecError, check_int
from windowkit.permutation import GOLDEN, index_shuffle, mix


class Sampler:
    """The epoch order of one split: its blocks, in groups, with their keys.

    ``windows_per_block`` counts the split's windows starting in each storage
    block of the store (every block, in store order).
    """

    def __init__(self, windows_per_block: np.ndarray, *, group: int, shuffle: bool,
                 seed: int) -> None:
        seed = check_int("seed", seed, 0)
        group = check_int("blocks_per_group", group, 1)
        counts = np.asarray(windows_per_block, dtype=np.int64)
        self.blocks = np.flatnonzero(counts > 0)  # the blocks holding windows of the split
        self.group = int(min(group, max(1, len(self.blocks))))
        self.shuffle = bool(shuffle)
        self.seed = int(seed)

    @property
    def num_groups(self) -> int:
        return -(-len(self.blocks) // self.group)

    def _epoch_key(self, epoch: int) -> np.uint64:
        if epoch < 0:
            raise InvalidSpecError(f"epoch must be >= 0, got {epoch}")
        return np.uint64(mix(np.array([self.seed * GOLDEN % 2**64], dtype=np.uint64)
                             ^ np.uint64(epoch))[0])

    def block_order(self, epoch: int) -> np.ndarray:
        """The blocks in the order epoch ``epoch`` visits them."""
        if not self.shuffle or len(self.blocks) < 2:
            return self.blocks
        n = len(self.blocks)
        return self.blocks[index_shuffle(np.arange(n), n, self._epoch_key(epoch))]

    def group_keys(self, epoch: int) -> np.ndarray:
        """One uint64 key per group of epoch ``epoch``: what permutes its windows."""
        groups = np.arange(1, self.num_groups + 1, dtype=np.uint64)
        return mix(self._epoch_key(epoch) + np.uint64(GOLDEN) * groups)

    def groups(self, epoch: int) -> Iterator[tuple[np.ndarray, np.uint64]]:
        """Epoch ``epoch``'s groups: their blocks (ascending, to read them in order)
        and their keys."""
        order, keys = self.block_order(epoch), self.group_keys(epoch)
        for g, lo in enumerate(range(0, len(order), self.group)):
            yield np.sort(order[lo:lo + self.group]), keys[g]


def blocks_per_group(num_blocks: int, *, fits: int, copies: int) -> int:
    """Blocks whose windows are mixed together: every block of the split when
    the reader's memory holds ``copies`` of them all (``fits`` blocks), else
    what one of ``copies`` shares of it holds."""
    if fits >= copies * num_blocks:
        return max(1, num_blocks)
    return max(1, fits // copies)
