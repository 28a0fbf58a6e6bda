"""Whole batches across groups of blocks, without ``rebatch``.

A group's windows rarely fill a whole number of batches. ``rebatch`` merges the
short batches at group ends, but it handles every batch on the way (about a
fifth of the reader's time here, and more with every part a batch carries).
Instead, a ``scan`` over the groups carries the windows left at a group's end
(fewer than a batch, already cut) into the next group, which first cuts just
enough windows to complete that batch. Every other batch is cut whole, from
one group's rows, straight into its final shape: the batches (and their
order) are exactly those ``rebatch`` would make, but only one batch per group
is copied.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from windowkit.readers.tfdata.cut import full_batch

if TYPE_CHECKING:
    import tensorflow as tf

    from windowkit.readers.tfdata.cut import WindowCutter


def carried_batches(groups: tf.data.Dataset, cutter: WindowCutter, *, batch_size: int,
                    drop_remainder: bool, empty_rows: tf.Tensor, with_series: bool
                    ) -> tf.data.Dataset:
    """Batches of ``batch_size`` windows from ``(rows, starts[, series])``
    groups, the last one short unless ``drop_remainder``. ``empty_rows``: a
    rows tensor of the store's shape (at least a window's span) to cut the
    structure of an empty batch from."""
    import tensorflow as tf

    B = batch_size  # noqa: N806
    no_starts = tf.zeros([0], tf.int64)
    empty = cutter(cutter.prepare(empty_rows), no_starts,
                   tf.zeros([0], tf.int32) if with_series else None)

    def unpack(group: tuple[tf.Tensor, ...]) -> tuple[tf.Tensor, tf.Tensor, Any]:
        rows, starts = group[0], group[1]
        return rows, starts, group[2] if with_series else None

    def step(carry: Any, element: tuple[Any, tf.Tensor]) -> tuple[Any, tuple[Any, ...]]:
        group, last = element
        rows, starts, series = unpack(group)
        prepared = cutter.prepare(rows)
        n, have = tf.size(starts, out_type=tf.int64), _size(carry)
        take = tf.where(have > 0, tf.minimum(n, B - have), 0)
        head = cutter(prepared, starts[:take], None if series is None else series[:take])
        carry = _concat(carry, head)
        rest = n - take
        full = rest // B * B
        tail_starts = starts[take + full:]
        tail = cutter(prepared, tail_starts,
                      None if series is None else series[take + full:])
        complete = _size(carry) == B
        flush = tf.logical_and(last, _size(carry) > 0)
        emit = tf.logical_or(complete, tf.logical_and(flush, tf.constant(not drop_remainder)))
        # the carry becomes this group's tail after a complete batch (or when
        # nothing was carried in); else it keeps growing; the end empties it
        new_carry = tf.nest.map_structure(
            lambda c, t: tf.cond(tf.logical_or(complete, have == 0), lambda: t, lambda: c),
            carry, tail)
        new_carry = tf.nest.map_structure(
            lambda c, e: tf.cond(last, lambda: e, lambda: c), new_carry, empty)
        middle = [tf.reshape(starts[take:take + full], [-1, B])]
        if series is not None:
            middle.append(tf.reshape(series[take:take + full], [-1, B]))
        return new_carry, (emit, carry, prepared, tuple(middle))

    def batches(emit: tf.Tensor, carried: Any, prepared: Any, middle: tuple[tf.Tensor, ...]
                ) -> tf.data.Dataset:
        # a carried batch is full: say so to the static shape
        first = tf.data.Dataset.from_tensors((emit, carried)).filter(
            lambda keep, _: keep).map(lambda _, batch: full_batch(batch, B) if drop_remainder
                                      else batch)
        cut = tf.data.Dataset.from_tensor_slices(middle).map(
            lambda *ids: cutter(prepared, *ids), num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True)
        return first.concatenate(cut)

    ending = tf.data.Dataset.from_tensors((tuple(_empty_group(empty_rows, with_series)), True))
    marked = groups.map(lambda *group: (tuple(group), False)).concatenate(ending)
    plain = tf.autograph.experimental.do_not_convert  # plain Python: traced faster
    return marked.scan(empty, plain(step)).flat_map(plain(batches))


def _empty_group(rows: tf.Tensor, with_series: bool) -> list[tf.Tensor]:
    import tensorflow as tf

    group = [rows, tf.zeros([0], tf.int64)]
    return [*group, tf.zeros([0], tf.int32)] if with_series else group


def _concat(a: Any, b: Any) -> Any:
    """Two batch structures, one after the other."""
    import tensorflow as tf

    return tf.nest.map_structure(lambda u, v: tf.concat([u, v], 0), a, b)


def _size(batch: Any) -> tf.Tensor:
    """How many windows a batch structure holds."""
    import tensorflow as tf

    return tf.shape(tf.nest.flatten(batch)[0], out_type=tf.int64)[0]
