"""The sampler: the one epoch order every reader follows.

Only the storage blocks holding windows of the split take part (a small split
never mixes its windows with blocks that hold none). Unshuffled, blocks come in
store order and windows in index order. Shuffled, each epoch has a key; the
epoch visits the blocks sorted by a keyed hash of their position (a uniform
random order), takes them ``group`` at a time, and permutes the windows of a
group together, with a key of the group's own. Orders are pure functions of
``(seed, epoch)``: nothing is drawn from a stateful generator.

The same order is computed in NumPy (:class:`windowkit.readers.EpochOrder`)
and in the graph (the ``tf.data`` readers, :meth:`Sampler.tf_epoch`);
the two are tested equal. Keras
permutes a group's windows with a keyed permutation
(:mod:`windowkit.readers.epoch.permutation`), ``tf.data`` with ``stateless_shuffle`` seeded
by the group's key. Either way a window's batch-mates come from the ``group``
blocks of its group.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from windowkit.errors import InvalidSpecError, check_int
from windowkit.readers.epoch.permutation import GOLDEN, mix, tf_mix

if TYPE_CHECKING:
    import tensorflow as tf


def epoch_key(seed: int, epoch: int) -> np.uint64:
    """The key of epoch ``epoch`` under ``seed``: what orders its blocks and
    keys its groups, in every reader."""
    if epoch < 0:
        raise InvalidSpecError(f"epoch must be >= 0, got {epoch}")
    return np.uint64(mix(np.array([seed * GOLDEN % 2**64], dtype=np.uint64)
                         ^ np.uint64(epoch))[0])


def group_keys(key: np.uint64, num_groups: int) -> np.ndarray:
    """One uint64 key per group of the epoch keyed ``key``: what permutes its windows."""
    groups = np.arange(1, num_groups + 1, dtype=np.uint64)
    return mix(np.uint64(key) + np.uint64(GOLDEN) * groups)


def uniform_key(seed: int, epoch: int) -> int:
    """The key of epoch ``epoch``'s uniform permutation of a split: that of
    the first group of a sampler with one group of every block, so a uniform
    shuffle and one group of every block are the same order."""
    return int(group_keys(epoch_key(seed, epoch), 1)[0])


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

    def epoch_key(self, epoch: int) -> np.uint64:
        """The key of epoch ``epoch``: what orders its blocks and keys its groups."""
        return epoch_key(self.seed, epoch)

    def block_order(self, epoch: int, *, key: np.uint64 | None = None) -> np.ndarray:
        """The blocks in the order epoch ``epoch`` (or the epoch keyed ``key``)
        visits them: sorted by a keyed hash of their position."""
        if not self.shuffle:
            return self.blocks
        key = self.epoch_key(epoch) if key is None else np.uint64(key)
        positions = np.arange(len(self.blocks), dtype=np.uint64)
        # int64 order, as the graph sorts (mix is a bijection: no ties)
        return self.blocks[np.argsort(mix(positions ^ key).view(np.int64), kind="stable")]

    def group_keys(self, epoch: int, *, key: np.uint64 | None = None) -> np.ndarray:
        """One uint64 key per group of epoch ``epoch`` (or the epoch keyed ``key``):
        what permutes its windows."""
        return group_keys(self.epoch_key(epoch) if key is None else np.uint64(key),
                          self.num_groups)

    def groups(self, epoch: int, *, key: np.uint64 | None = None
               ) -> Iterator[tuple[np.ndarray, np.uint64]]:
        """Epoch ``epoch``'s groups: their blocks (ascending, to read them in order)
        and their keys."""
        key = self.epoch_key(epoch) if key is None else np.uint64(key)
        order, keys = self.block_order(epoch, key=key), self.group_keys(epoch, key=key)
        for g, lo in enumerate(range(0, len(order), self.group)):
            yield np.sort(order[lo:lo + self.group]), keys[g]

    # The same order in the graph, for the tf.data readers.

    def tf_epoch_key(self, epoch: tf.Tensor) -> tf.Tensor:
        """:meth:`epoch_key` in the graph: the uint64 key of epoch ``epoch``
        (an int64 scalar tensor)."""
        import tensorflow as tf

        if not self.shuffle:
            return tf.constant(0, tf.uint64)
        seed = tf.constant(self.seed * GOLDEN % 2**64, tf.uint64)
        return tf_mix(tf.bitwise.bitwise_xor(seed, tf.cast(epoch, tf.uint64)))

    def tf_epoch(self, key: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """The epoch keyed ``key`` (uint64 scalar) in the graph, as :meth:`groups`
        gives it: every block in visiting order, each group's ascending, and each
        block's group key (its bits as int64)."""
        import tensorflow as tf

        n, size = len(self.blocks), self.group
        blocks = tf.constant(self.blocks, tf.int64)
        if self.shuffle:
            hashed = tf_mix(tf.bitwise.bitwise_xor(tf.cast(tf.range(n, dtype=tf.int64),
                                                           tf.uint64), key))
            blocks = tf.gather(blocks, tf.argsort(tf.bitcast(hashed, tf.int64), stable=True))
        group = tf.range(n, dtype=tf.int64) // size
        # ascending within each group: sort by (group, block)
        blocks = tf.gather(blocks, tf.argsort(group * (int(self.blocks.max(initial=0)) + 1)
                                              + blocks, stable=True))
        golden = tf.constant(GOLDEN, tf.uint64)
        keys = tf_mix(key + golden * tf.cast(group + 1, tf.uint64))
        return blocks, tf.bitcast(keys, tf.int64)


def blocks_per_group(num_blocks: int, *, fits: int, copies: int) -> int:
    """Blocks whose windows are mixed together: every block of the split when
    the reader's memory holds ``copies`` of them all (``fits`` blocks), else
    the largest power of two that one of ``copies`` shares of it holds (so
    that machines whose budgets differ by less than half mix alike)."""
    if fits >= copies * num_blocks:
        return max(1, num_blocks)
    holds = max(1, fits // copies)
    return 1 << (holds.bit_length() - 1)


GROUP_SHARE = 6  # a group's rows are held ~6 times (read-ahead, decode, cut, batches)


def default_group(shuffle_blocks: int | None, *, cache_bytes: int, block_bytes: int,
                  num_blocks: int) -> int:
    """Blocks whose windows are mixed together: ``shuffle_blocks``, else every
    block holding windows when ``GROUP_SHARE`` copies of them fit ``cache_bytes``,
    else what does."""
    if shuffle_blocks is None:
        return blocks_per_group(num_blocks, fits=cache_bytes // max(1, block_bytes),
                                copies=GROUP_SHARE)
    return max(1, min(shuffle_blocks, max(1, num_blocks)))
