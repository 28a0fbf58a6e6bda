"""XXH3-64 with a seed, in TensorFlow's own ops: the block digests of
:mod:`windowkit.formats._checks` (``xxhash.xxh3_64_intdigest(data, seed)``),
checked in the ``tf.data`` graph.

:func:`xxh3_64` hashes many inputs of one length at once (the blocks of a
group), each with its own seed, with whole-tensor integer ops on ``uint64``
(wrapping arithmetic, as the reference). The only sequential part is the
long-input scramble, one step per KiB of input, on ``[inputs, 8]`` lanes.
Every length class of the reference is here (0-16, 17-240 and longer);
``tests/readers/test_tfrecord_graph.py`` compares them with ``xxhash`` at
every class boundary.

The graph is kept small (constants shared within a function graph, pieces
mixed as one tensor): ``tf.data`` instantiates its functions again for every
iterator (every epoch), at a cost that grows with their ops.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import tensorflow as tf

_SECRET = bytes.fromhex(
    "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671f"
    "cb79e64eccc0e578825ad07dccff7221b8084674f743248ee03590e6813a264c"
    "3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8"
    "a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364"
    "eac5ac8334d3ebc3c581a0fffa1363eb170ddd51b7f0da49d316552629d4689e"
    "2b16be587d47a1fc8ff8b8d17ad031ce45cb3a8f95160428afd7fbcabb4b407e")
PRIME32_1, PRIME32_2, PRIME32_3 = 0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D
PRIME64_1, PRIME64_2, PRIME64_3 = 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9
PRIME64_4, PRIME64_5 = 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5
_MX1, _MX2 = 0x165667919E3779F9, 0x9FB21C651E98DF25
_INIT_ACC = (PRIME32_3, PRIME64_1, PRIME64_2, PRIME64_3, PRIME64_4, PRIME32_2, PRIME64_5,
             PRIME32_1)
_STRIPE, _BLOCK = 64, 1024  # bytes of a stripe, and of the 16 stripes between scrambles
_MASK32 = 0xFFFFFFFF
_LANES = np.frombuffer(_SECRET, dtype="<u8").astype(np.uint64)  # the secret, as 24 lanes

#: uint64 scalar constants already made, per function graph (one node each)
_CONSTANTS: weakref.WeakKeyDictionary[Any, dict[int, Any]] = weakref.WeakKeyDictionary()


def _secret64(at: int) -> int:
    """The default secret's little-endian uint64 at byte ``at``."""
    return int.from_bytes(_SECRET[at:at + 8], "little")


def _u64(value: Any) -> tf.Tensor:
    """``value`` as a uint64 constant (a scalar: one per function graph)."""
    import tensorflow as tf

    array = np.asarray(value, dtype=np.uint64)
    if array.ndim:
        return tf.constant(array)
    made = _CONSTANTS.setdefault(tf.compat.v1.get_default_graph(), {})
    if int(array) not in made:
        made[int(array)] = tf.constant(array)
    return made[int(array)]


def _shr(x: tf.Tensor, bits: int) -> tf.Tensor:
    import tensorflow as tf

    return tf.bitwise.right_shift(x, _u64(bits))


def _shl(x: tf.Tensor, bits: int) -> tf.Tensor:
    import tensorflow as tf

    return tf.bitwise.left_shift(x, _u64(bits))


def _xor(*values: tf.Tensor) -> tf.Tensor:
    import tensorflow as tf

    out = values[0]
    for value in values[1:]:
        out = tf.bitwise.bitwise_xor(out, value)
    return out


def _low32(x: tf.Tensor) -> tf.Tensor:
    import tensorflow as tf

    return tf.bitwise.bitwise_and(x, _u64(_MASK32))


def _fold(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    """The 128-bit product of ``a`` and ``b``, its halves xor-ed (``mul128_fold64``)."""
    import tensorflow as tf

    a0, a1, b0, b1 = _low32(a), _shr(a, 32), _low32(b), _shr(b, 32)
    low, high_low, low_high = a0 * b0, a1 * b0, a0 * b1
    cross = _shr(low, 32) + _low32(high_low) + low_high
    upper = _shr(high_low, 32) + _shr(cross, 32) + a1 * b1
    lower = tf.bitwise.bitwise_or(_shl(cross, 32), _low32(low))
    return _xor(lower, upper)


def _avalanche(h: tf.Tensor) -> tf.Tensor:
    h = _xor(h, _shr(h, 37)) * _u64(_MX1)
    return _xor(h, _shr(h, 32))


def _xxh64_avalanche(h: tf.Tensor) -> tf.Tensor:
    h = _xor(h, _shr(h, 33)) * _u64(PRIME64_2)
    h = _xor(h, _shr(h, 29)) * _u64(PRIME64_3)
    return _xor(h, _shr(h, 32))


def _signed(seed: tf.Tensor) -> tf.Tensor:
    """``[seed, -seed]`` per input (``[inputs, 2]``), as the secret's pairs take it."""
    import tensorflow as tf

    return tf.stack([seed, _u64(0) - seed], 1)


def _words(raw: tf.Tensor, at: Any) -> tf.Tensor:
    """The little-endian uint64 at each byte offset ``at`` (int64, any shape) of
    every input's bytes ``raw`` (``[inputs, bytes]``): ``[inputs, *at.shape]``."""
    import tensorflow as tf

    picked = tf.gather(raw, tf.expand_dims(at, -1) + np.arange(8), axis=1)
    return tf.bitcast(picked, tf.uint64)


def _upto16(raw: tf.Tensor, length: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """Inputs of 0 to 16 bytes (``raw`` padded past them): each rule computed,
    the length's kept."""
    import tensorflow as tf

    size = tf.cast(length, tf.uint64)
    keys = _u64([_secret64(24) ^ _secret64(32), _secret64(40) ^ _secret64(48)])
    words = _words(raw, tf.stack([tf.constant(0, tf.int64), tf.maximum(length - 8, 0)]))
    lo, hi = tf.unstack(_xor(words, keys + _signed(seed)), axis=1)  # first, last 8 bytes
    swapped = tf.bitcast(tf.reverse(tf.bitcast(lo, tf.uint8), [-1]), tf.uint64)
    over8 = _avalanche(size + swapped + hi + _fold(lo, hi))
    bytes64 = tf.cast(raw, tf.uint64)
    low = tf.bitcast(tf.reverse(tf.bitcast(_low32(seed), tf.uint8)[:, :4], [-1]), tf.uint32)
    seed4 = _xor(seed, _shl(tf.cast(low, tf.uint64), 32))
    ends = tf.reduce_sum(tf.bitwise.left_shift(tf.gather(bytes64, tf.stack(  # last, first 4
        [tf.maximum(length - 4, 0), tf.constant(0, tf.int64)])[:, None] + np.arange(4), axis=1),
        _u64(8 * np.arange(4))), 2)
    h = _xor(tf.reduce_sum(ends * _u64([1, 2**32]), 1), _u64(_secret64(8) ^ _secret64(16)) - seed4)
    h = _xor(h, _xor(_shl(h, 49), _shr(h, 15)), _xor(_shl(h, 24), _shr(h, 40))) * _u64(_MX2)
    h = _xor(h, _shr(h, 35) + size) * _u64(_MX2)
    over4 = _xor(h, _shr(h, 28))
    picked = tf.gather(bytes64, tf.stack([tf.constant(0, tf.int64), length // 2,  # disjoint
                                          tf.maximum(length - 1, 0)]), axis=1)  # bits: summed
    combined = tf.reduce_sum(tf.bitwise.left_shift(picked, _u64([16, 24, 0])), 1)
    flip = _u64((_secret64(0) & _MASK32) ^ (_secret64(4) & _MASK32)) + seed
    over0 = _xxh64_avalanche(_xor(combined + _shl(size, 8), flip))
    empty = _xxh64_avalanche(_xor(seed, _u64(_secret64(56) ^ _secret64(64))))
    return tf.where(length > 8, over8, tf.where(length >= 4, over4,
                                                tf.where(length > 0, over0, empty)))


def _mid_pieces() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every 16-byte piece an input of 17 to 240 bytes may mix: from the start
    (its offset) or from the end (its offset before the end), its secret
    offset, and the pieces' roles (``tier``: up to 128 bytes, the tier that
    mixes it; over 128, ``-1``; ``rank``: over 128, its 16-byte rank)."""
    start, back, secret, tier, rank = [], [], [], [], []
    for i in range(4):  # up to 128 bytes: tier i mixes 16 bytes from each end
        for from_end in (False, True):
            start.append(0 if from_end else 16 * i)
            back.append(16 * (i + 1) if from_end else 0)
            secret.append(32 * i + 16 * from_end)
            tier.append(i)
            rank.append(-1)
    for i in range(15):  # over 128: 16 bytes at a time, then the last 16
        start.append(16 * i)
        back.append(0)
        secret.append(16 * i if i < 8 else 16 * (i - 8) + 3)
        tier.append(-1)
        rank.append(i)
    start.append(0)
    back.append(16)
    secret.append(136 - 17)
    tier.append(-1)
    rank.append(-2)
    return (np.array(start), np.array(back), np.array(secret),
            np.stack([np.array(tier), np.array(rank)]))


def _upto240(raw: tf.Tensor, length: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """Inputs of 17 to 240 bytes (``raw`` padded past them): every piece either
    rule may mix, mixed at once; each rule sums those its length takes."""
    import tensorflow as tf

    start, back, secret, roles = _mid_pieces()
    tier, rank = tf.unstack(tf.constant(roles, tf.int64))
    at = tf.maximum(tf.where(back > 0, length - back, start), 0)
    words = _words(raw, tf.stack([at, at + 8], 1))  # [n, pieces, 2]
    keys = _u64([[_secret64(int(a)), _secret64(int(a) + 8)] for a in secret])
    lo, hi = tf.unstack(_xor(words, keys + _signed(seed)[:, None]), axis=2)
    mixed = _fold(lo, hi)

    def total(mask: tf.Tensor) -> tf.Tensor:
        return tf.reduce_sum(tf.where(mask, mixed, _u64(0)), 1)

    begin = _u64(PRIME64_1) * tf.cast(length, tf.uint64)
    small = _avalanche(begin + total(tf.logical_and(tier >= 0, tier <= (length - 1) // 32)))
    first = _avalanche(begin + total(tf.logical_and(rank >= 0, rank < 8)))
    large = _avalanche(first + total(tf.logical_or(rank == -2, tf.logical_and(
        rank >= 8, rank < length // 16))))
    return tf.where(length <= 128, small, large)


def _stripes(data: tf.Tensor, keys: tf.Tensor) -> tf.Tensor:
    """What stripes ``data[..., stripe, 8]`` add to the 8 accumulators, keyed
    by ``keys[..., stripe, 8]``, summed over the stripes (axis -2): each lane
    its keyed halves' product, and its neighbour's value."""
    import tensorflow as tf

    keyed = _xor(data, keys)
    product = tf.reduce_sum(_low32(keyed) * _shr(keyed, 32), axis=-2)
    return product + tf.gather(tf.reduce_sum(data, axis=-2), [1, 0, 3, 2, 5, 4, 7, 6], axis=-1)


def _long(raw: tf.Tensor, length: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """Inputs of more than 240 bytes: 64-byte stripes into 8 accumulators,
    scrambled after every KiB, with a secret derived from the seed."""
    import tensorflow as tf

    n = tf.shape(raw)[0]
    lanes = _u64(_LANES)[None] + tf.tile(_signed(seed), [1, 12])  # the seed's secret
    _, scramble = tf.split(lanes, [16, 8], axis=1)
    # the secret's 8 lanes at bytes 121 (the last stripe's key) and 11 (the merge's)
    unaligned = tf.gather(tf.reshape(tf.bitcast(lanes, tf.uint8), [n, 192]),
                          np.array([121, 11])[:, None] + np.arange(64), axis=1)
    last_key, merge_key = tf.unstack(tf.bitcast(tf.reshape(unaligned, [n, 2, 8, 8]),
                                                tf.uint64), axis=1)
    blocks = (length - 1) // _BLOCK
    stripes = ((length - 1) - blocks * _BLOCK) // _STRIPE
    keys = tf.gather(lanes, np.arange(16)[:, None] + np.arange(8), axis=1)  # [n, 16, 8]
    body = tf.bitcast(tf.reshape(raw[:, :(blocks * 16 + stripes) * _STRIPE], [n, -1, 8, 8]),
                      tf.uint64)  # [n, stripes, 8]
    full, tail = tf.split(body, tf.stack([blocks * 16, stripes]), axis=1)
    added = tf.transpose(_stripes(tf.reshape(full, [n, -1, 16, 8]), keys[:, None]), [1, 0, 2])

    def scrambled(k: tf.Tensor, acc: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        acc = acc + added[k]
        return k + 1, _xor(acc, _shr(acc, 47), scramble) * _u64(PRIME32_1)

    acc = tf.tile(_u64(np.array(_INIT_ACC, dtype=np.uint64))[None], [n, 1])
    _, acc = tf.while_loop(lambda k, _: k < blocks, scrambled, (tf.constant(0, tf.int64), acc))
    last = _words(raw, length - _STRIPE + 8 * np.arange(8))  # the last 64 bytes
    acc = acc + _stripes(tf.concat([tail, last[:, None]], 1),
                         tf.concat([keys[:, :stripes], last_key[:, None]], 1))
    a, b = tf.unstack(tf.reshape(_xor(acc, merge_key), [n, 4, 2]), axis=2)
    return _avalanche(_u64(PRIME64_1) * tf.cast(length, tf.uint64) + tf.reduce_sum(_fold(a, b), 1))


#: The rule of each length class: up to 16 bytes, up to 240, longer.
_RULES = {"short": _upto16, "mid": _upto240, "long": _long}
_PADDING = {"short": 16, "mid": 240, "long": 0}  # zero bytes after an input: reads stay in


def length_class(length: int) -> str:
    """The rule XXH3 hashes inputs of ``length`` bytes with."""
    return "short" if length <= 16 else "mid" if length <= 240 else "long"


def xxh3_64(units: tf.Tensor, length: Any, seeds: tf.Tensor, kind: str | None = None
            ) -> tf.Tensor:
    """``xxhash.xxh3_64_intdigest(unit, seed)`` of each string of ``units``
    (each exactly ``length`` bytes, an int or an int64 scalar; ``kind``: its
    :func:`length_class`, where ``length`` is a tensor), with its own ``seeds``
    (uint64), as uint64."""
    import tensorflow as tf

    kind = kind or length_class(int(length))
    length = tf.cast(length, tf.int64)
    raw = tf.reshape(tf.io.decode_raw(units, tf.uint8), [-1, length])  # no input: [0, length]
    if _PADDING[kind]:
        raw = tf.pad(raw, [[0, 0], [0, _PADDING[kind]]])
    return _RULES[kind](raw, length, tf.cast(seeds, tf.uint64))
