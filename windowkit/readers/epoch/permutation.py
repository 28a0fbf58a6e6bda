"""Keyed pseudo-random permutations of ``[0, size)`` (numpy, vectorized).

A Feistel network with cycle walking, as in
``tf.random.experimental.index_shuffle`` and grain's index sampler: where a
permutation sends any index is computed directly, in any order, with no
permutation held in memory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike

if TYPE_CHECKING:
    import tensorflow as tf

_ROUNDS = 4  # Feistel rounds, each part twice (Luby-Rackoff: a pseudo-random permutation)
GOLDEN = 0x9E3779B97F4A7C15  # 2**64 / golden ratio: spreads consecutive keys
_ODD = np.uint64(0xD6E8FEB86659FD93)  # multiplier of the round hash
_FOLD = np.uint64(32)


def mix(x: np.ndarray) -> np.ndarray:
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
            [mix(key + np.uint64(GOLDEN * (r + 1) % 2**64)) for r in range(_ROUNDS)])

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


def tf_mix(x: tf.Tensor) -> tf.Tensor:
    """:func:`mix` on a uint64 tensor, for orders computed in the graph."""
    import tensorflow as tf

    def shift_xor(v: tf.Tensor, bits: int) -> tf.Tensor:
        return tf.bitwise.bitwise_xor(v, tf.bitwise.right_shift(v, tf.constant(bits, tf.uint64)))

    x = shift_xor(x, 30) * tf.constant(0xBF58476D1CE4E5B9, tf.uint64)
    x = shift_xor(x, 27) * tf.constant(0x94D049BB133111EB, tf.uint64)
    return shift_xor(x, 31)


def tf_permute(index: tf.Tensor, size: tf.Tensor, key: tf.Tensor) -> tf.Tensor:
    """:class:`KeyedPermutations` in the graph: where the permutation of
    ``[0, size)`` keyed by ``key`` (a uint64 scalar) sends ``index`` (int64, each
    in ``[0, size)``); the same numbers as NumPy's."""
    import tensorflow as tf

    u64 = tf.uint64
    size = tf.cast(size, tf.int64)
    # bit length of size - 1 (at least 2), with integer ops: exact at any size
    top = tf.cast(tf.maximum(size - 1, 1), u64)
    bits = tf.reduce_sum(tf.cast(tf.bitwise.right_shift(
        top, tf.cast(tf.range(64), u64)) > 0, u64))
    bits = tf.maximum(bits, tf.constant(2, u64))
    half = tf.bitwise.right_shift(bits, tf.constant(1, u64))
    low_bits = bits - half
    one = tf.constant(1, u64)
    low_mask = tf.bitwise.left_shift(one, low_bits) - one
    high_mask = tf.bitwise.left_shift(one, half) - one
    keys = [tf_mix(tf.cast(key, u64) + tf.constant(GOLDEN * (r + 1) % 2**64, u64))
            for r in range(_ROUNDS)]
    odd, fold = tf.constant(int(_ODD), u64), tf.constant(int(_FOLD), u64)

    def feistel(x: tf.Tensor) -> tf.Tensor:
        high, low = tf.bitwise.right_shift(x, low_bits), tf.bitwise.bitwise_and(x, low_mask)
        for i, k in enumerate(keys):
            if i % 2:
                f = tf.bitwise.bitwise_xor(high, k) * odd
                low = tf.bitwise.bitwise_xor(low, tf.bitwise.bitwise_and(
                    tf.bitwise.bitwise_xor(f, tf.bitwise.right_shift(f, fold)), low_mask))
            else:
                f = tf.bitwise.bitwise_xor(low, k) * odd
                high = tf.bitwise.bitwise_xor(high, tf.bitwise.bitwise_and(
                    tf.bitwise.bitwise_xor(f, tf.bitwise.right_shift(f, fold)), high_mask))
        return tf.bitwise.bitwise_or(tf.bitwise.left_shift(high, low_bits), low)

    limit = tf.cast(size, u64)
    out = feistel(tf.cast(index, u64))
    # cycle walking: apply again while outside [0, size)
    out = tf.while_loop(lambda x: tf.reduce_any(x >= limit),
                        lambda x: [tf.where(x >= limit, feistel(x), x)], [out])[0]
    return tf.cast(out, tf.int64)
