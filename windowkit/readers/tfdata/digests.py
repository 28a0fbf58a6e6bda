"""The per-block digests (:mod:`windowkit.formats._checks`) checked in the
``tf.data`` graph, for groups of blocks a format reads there.

A group's raw rows hold each of its blocks as one run of bytes, followed by
the halo its last record holds (rows of the next block). Every block is
hashed whole (:func:`windowkit.readers.tfdata.xxh3.xxh3_64`, seeded as
the writer seeded it) and compared with the digest written with the store;
a halo holding the whole head of the next block (its first ``span - 1``
rows) is compared with that block's head digest, as the Python readers
check the halo they read. A halo cut short by the end of its series holds
only part of the next block's head: that block is read too (whole, and so
checked), and the halo compared with its first rows. A mismatch is one
windowkit error naming the block, in the words of the Python readers.

Inputs are hashed by kind (block or head, of the last block or another: one
length each; only the kinds the plan's blocks can hold are in the graph),
each by the function of its XXH3 length class: not inlined, traced once per
process, called without TensorFlow's graph optimizer
(:func:`windowkit.formats.base.plain_call`). ``tf.data`` instantiates a
pipeline's functions for every iterator (every epoch), at a cost that grows
with their ops: what runs once per epoch is kept small.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import TYPE_CHECKING, Any

import numpy as np

from windowkit.formats._checks import digest_base
from windowkit.formats.base import noinline, plain_call
from windowkit.readers.tfdata.xxh3 import length_class, xxh3_64

if TYPE_CHECKING:
    import tensorflow as tf

    from windowkit.readers.plan import ReadPlan

#: ``(ok, message)`` -> an op raising the store's error when ``ok`` is false.
Check = Callable[[Any, Callable[[], Any]], Any]

HASHED_BYTES = 16 << 20  # bytes of blocks hashed at a time


@cache
def _matcher(kind: str) -> Any:
    """``match(units, seeds, digests)``: whether each of ``units`` (strings of
    one length) hashes, with its seed, to its digest; one function per XXH3
    length class, not inlined (instantiated where it runs) and traced once.
    It takes no constant (the length comes from the units): TensorFlow would
    specialize it for each caller's constants, and instantiate each copy."""
    import tensorflow as tf

    def match(units: tf.Tensor, seeds: tf.Tensor, digests: tf.Tensor) -> tf.Tensor:
        length = tf.cast(tf.strings.length(units[:1]), tf.int64)
        return tf.cond(tf.size(units) > 0, lambda: tf.equal(
            xxh3_64(units, length[0], seeds, kind), digests), lambda: tf.zeros([0], tf.bool))

    return noinline(match, [(tf.string, [None]), (tf.uint64, [None]), (tf.uint64, [None])])


def _matched(raw: tf.Tensor, at: tf.Tensor, length: int, seeds: tf.Tensor,
             digests: tf.Tensor) -> tf.Tensor:
    """Whether the ``length`` bytes of ``raw`` from each byte ``at`` hash (with
    its seed) to its digest: hashed ``HASHED_BYTES`` at a time, two pieces at
    once, so that hashing a group holds a few pieces' temporaries, not
    several copies of the group."""
    import tensorflow as tf

    per = max(1, HASHED_BYTES // length)  # units a piece
    count = tf.size(at)
    match = _matcher(length_class(length))

    def piece(i: tf.Tensor, done: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        lo, hi = i * per, tf.minimum(count, (i + 1) * per)
        units = tf.strings.substr(raw, at[lo:hi], tf.fill([hi - lo], tf.constant(length,
                                                                                  tf.int64)))
        return i + 1, tf.concat([done, plain_call(match, units, seeds[lo:hi],
                                                  digests[lo:hi])[0]], 0)

    _, done = tf.while_loop(lambda i, _: i * per < count, piece,
                            (tf.constant(0), tf.zeros([0], tf.bool)),
                            shape_invariants=(tf.TensorShape([]), tf.TensorShape([None])),
                            parallel_iterations=2)
    return done


class GroupDigests:
    """Checks the blocks of a group, read as raw bytes, against their digests."""

    def __init__(self, plan: ReadPlan, table: np.ndarray, blocks: np.ndarray, *,
                 check: Check, describe: Callable[[tf.Tensor], tf.Tensor],
                 short_halos: np.ndarray | None = None) -> None:
        import tensorflow as tf

        layout = plan.layout
        self._rows, self._row_bytes = layout.block_rows, layout.row_bytes
        self._last = layout.num_blocks - 1
        self._last_rows = last_rows = layout.total_rows - self._last * self._rows
        self._halo = plan.spec.span - 1
        self._table = tf.constant(table.astype(np.uint64))
        self._base = np.uint64(digest_base(plan.store.store_id, layout.dtype, layout.step_shape,
                                           layout.block_rows, self._halo))
        self._check, self._describe = check, describe
        # whether each block's halo is cut short (read with the next block), where any is
        self._short = (tf.constant(short_halos) if short_halos is not None
                       and np.any(short_halos[blocks]) else None)
        self._where = plan.store.path / plan.store.data["digests"]
        heads = self._halo > 0 and len(blocks) > 0
        # (head?, of the last block?, rows) of each kind the blocks can hold
        self._kinds = [(head, last, min(self._halo, rows) if head else rows)
                       for head, last, rows, there in [
                           (False, False, self._rows, np.any(blocks != self._last)),
                           (False, True, last_rows, np.any(blocks == self._last)),
                           (True, False, self._rows, heads and np.any(blocks + 1 < self._last)),
                           (True, True, last_rows, heads and np.any(blocks + 1 == self._last))]
                       if there]

    def checked(self, rows: tf.Tensor, raw: tf.Tensor, blocks: tf.Tensor, offsets: tf.Tensor,
                halos: tf.Tensor, asked: tf.Tensor | None = None) -> tf.Tensor:
        """``rows``, once the blocks in ``raw`` (block ``blocks[i]`` from row
        ``offsets[i]``, then ``halos[i]`` rows of the next block) match their
        digests (``asked``: the blocks of the group, without those read to
        check a halo cut short; default ``blocks``)."""
        import tensorflow as tf

        size = self._block_rows(blocks)
        head_rows = tf.minimum(tf.constant(self._halo, tf.int64), self._block_rows(blocks + 1))
        has_head = tf.logical_and(blocks < self._last, tf.equal(halos, head_rows))
        if self._halo == 0:
            has_head = tf.zeros_like(has_head)
        heads = tf.reshape(tf.where(has_head), [-1])
        block = tf.concat([blocks, tf.gather(blocks + 1, heads)], 0)
        start = tf.concat([offsets, tf.gather(offsets + size, heads)], 0)
        head = tf.range(tf.size(block)) >= tf.size(blocks)
        match = self._matches(raw, block, start, head)
        check = self._check(tf.reduce_all(match), lambda: self._problem(block, head, match))
        with tf.control_dependencies([check]):
            if self._short is None:
                return tf.identity(rows)
            return self._halos_checked(rows, raw, blocks, offsets, halos,
                                       blocks if asked is None else asked)

    def _halos_checked(self, rows: tf.Tensor, raw: tf.Tensor, blocks: tf.Tensor,
                       offsets: tf.Tensor, halos: tf.Tensor, asked: tf.Tensor) -> tf.Tensor:
        """``rows``, once every halo cut short equals the first rows of the
        next block (read too, and checked whole). A mismatch names the next
        block's rows where it is one of the group's (the Python readers read
        the two as one run), else its head."""
        import tensorflow as tf

        # the group's own blocks whose halo is cut short (a block read only to
        # check such a halo has no windows here: its own halo is not read on)
        block = tf.boolean_mask(asked, tf.gather(self._short, asked))
        short = tf.searchsorted(blocks, block)  # where each is among the blocks read
        after = tf.searchsorted(blocks, block + 1)  # the next block, read with it
        length = tf.gather(halos, short) * self._row_bytes
        halo = tf.strings.substr(raw, (tf.gather(offsets, short) + self._block_rows(block))
                                 * self._row_bytes, length)
        same = tf.equal(halo, tf.strings.substr(raw, tf.gather(offsets, after)
                                                * self._row_bytes, length))
        in_group = tf.equal(tf.gather(tf.concat([asked, [-1]], 0),
                                      tf.searchsorted(asked, block + 1)), block + 1)
        check = self._check(tf.reduce_all(same), lambda: self._problem(
            block + 1, tf.logical_not(in_group), same))
        with tf.control_dependencies([check]):
            return tf.identity(rows)

    def _block_rows(self, block: tf.Tensor) -> tf.Tensor:
        import tensorflow as tf

        return tf.where(block == self._last, tf.constant(self._last_rows, tf.int64),
                        tf.constant(self._rows, tf.int64))

    def _matches(self, raw: tf.Tensor, block: tf.Tensor, start: tf.Tensor, head: tf.Tensor
                 ) -> tf.Tensor:
        """Whether each unit (a block, or the head of one) matches its digest,
        hashed kind by kind (one length each)."""
        import tensorflow as tf

        found = tf.zeros(tf.shape(block), tf.bool)
        is_last = tf.equal(block, self._last)
        for want_head, want_last, rows in self._kinds:  # in turn: a hash shared by two kinds
            # is instantiated once, not by both at the same time
            chosen = tf.reshape(tf.where(tf.logical_and(tf.equal(head, want_head),
                                                        tf.equal(is_last, want_last))), [-1])
            at = tf.gather(block, chosen)
            with tf.control_dependencies([found]):
                match = _matched(raw, tf.gather(start, chosen) * self._row_bytes,
                                 rows * self._row_bytes,
                                 self._base + 2 * tf.cast(at, tf.uint64) + np.uint64(want_head),
                                 tf.gather(self._table[:, int(want_head)], at))
            found = tf.tensor_scatter_nd_update(found, chosen[:, None], match)
        return found

    def _problem(self, block: tf.Tensor, head: tf.Tensor, match: tf.Tensor) -> tf.Tensor:
        """The message naming the first unit that does not match."""
        import tensorflow as tf

        i = tf.argmin(tf.cast(match, tf.int32))
        return digest_problem()(self._describe(block[i]), block[i], head[i],
                                self._block_rows(block[i]), self._rows, self._halo,
                                str(self._where))


@cache
def digest_problem() -> Any:
    """``problem(where, block, head, rows, block_rows, halo, digests_file)``:
    the message of a block (or its head) whose digest does not match. Not
    inlined: built, and run, only on failure."""
    import tensorflow as tf

    def problem(where: Any, block: Any, head: Any, rows: Any, block_rows: Any, halo: Any,
                digests: Any) -> Any:
        text, first = tf.strings.as_string, block * block_rows
        stop = first + tf.where(head, tf.minimum(halo, rows), rows)
        return tf.strings.join([
            where, ": block ", text(block), " (rows ", text(first), "..", text(stop),
            "): its decoded ", tf.where(head, "first rows", "rows"), " do not match the "
            "digest written with the store in ", digests, " (a file was changed, or belongs "
            "to another store or place)"])

    return noinline(problem, [(tf.string, []), (tf.int64, []), (tf.bool, []), (tf.int64, []),
                              (tf.int64, []), (tf.int64, []), (tf.string, [])])
