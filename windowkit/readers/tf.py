"""The ``tf.data`` reader: a store's blocks -> windows -> batches, with no Python
per batch.

1. Groups of blocks in the sampler's order (:mod:`windowkit.readers.tfdata_engine.groups`):
   ``(rows, starts)``, the rows of a group of storage blocks with their halos
   and the positions of the split's windows starting in them, shuffled within
   the group when asked. Where the rows are read
   (:mod:`windowkit.readers.tfdata_engine.reads`): a local, uncompressed
   TFRecord store in TensorFlow's own ops (ranged ``TFRecordDataset`` reads
   under a parallel ``interleave``, records and block digests checked in the
   graph, no Python per group); every other store (Zarr, Parquet, GZIP
   TFRecord parts, object storage) through the format's row reader, one
   ``numpy_function`` call per group.
2. Batches are cut with one ``tf.gather`` per part under a parallel ``map``,
   normalized in the graph when asked; the windows left at a group's end are
   carried into the next group's first batch
   (:mod:`windowkit.readers.tfdata_engine.carry`, no ``rebatch``), then
   ``assert_cardinality`` -> ``prefetch`` (optionally onto a GPU).

How it shuffles (:func:`windowkit.readers.choice.choose_shuffle`): uniformly
when asked (``"global"``) or when the split's rows fit the memory budget
(:mod:`windowkit.readers.tfdata_engine.uniform`: rows held once, in memory or
spilled, every format, batches cut from them in the graph as in step 2); else
block groups: each epoch permutes the blocks holding windows of the split,
and the windows of ``shuffle_blocks`` blocks at a time (as many as the
budget holds) are permuted together.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from windowkit.errors import InvalidSpecError
from windowkit.readers import num_batches
from windowkit.readers.choice import epoch_order, shuffle_choice
from windowkit.readers.numpy_engine.fields import BatchFields
from windowkit.readers.options import warn_if_no_batch
from windowkit.readers.saved import saved_for
from windowkit.readers.tfdata_engine.cut import PREFETCH_BATCHES, WindowCutter
from windowkit.spec import WindowSpec
from windowkit.stats import Normalizer

if TYPE_CHECKING:
    import tensorflow as tf

    from windowkit.readers.options import BatchOptions, ShuffleOptions
    from windowkit.readers.plan import ReadPlan



def batch_cutter(spec: WindowSpec, batch_size: int, norm: Normalizer | None,
                 targets: np.ndarray | None = None, fields: BatchFields | None = None
                 ) -> Callable[..., tf.data.Dataset]:
    """``cut(rows, starts, series=None)``: a dataset of batches of the windows
    starting at ``starts`` in ``rows``, each batch one ``tf.gather``, cut in
    parallel (``series``: the windows' series ids, for dict batches)."""
    import tensorflow as tf

    cutter = WindowCutter(spec, norm, targets, fields)

    def cut(rows: tf.Tensor, starts: tf.Tensor, series: tf.Tensor | None = None
            ) -> tf.data.Dataset:
        n = tf.size(starts, out_type=tf.int64)
        prepared = cutter.prepare(rows)  # once per group
        return tf.data.Dataset.range(0, n, batch_size).map(
            lambda lo: cutter(prepared, starts[lo:lo + batch_size],
                              None if series is None else series[lo:lo + batch_size]),
            num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)

    return cut


def cut_groups(groups: tf.data.Dataset, plan: ReadPlan, cutter: WindowCutter, *,
               batch_size: int, drop_remainder: bool, with_series: bool) -> tf.data.Dataset:
    """From one epoch's ``(rows, starts[, series])`` groups to the reader's
    batches: cut (and normalize) windows with ``cutter``, whole batches across
    groups (the windows left at a group's end carried into the next one).
    Nothing here opens the store: safe to call while an epoch is traced."""
    import tensorflow as tf

    from windowkit.readers.tfdata_engine.carry import carried_batches

    empty_rows = tf.zeros([plan.spec.span, *plan.layout.step_shape], tf.as_dtype(plan.layout.dtype))
    return carried_batches(groups, cutter, batch_size=batch_size,
                           drop_remainder=drop_remainder, empty_rows=empty_rows,
                           with_series=with_series)


def tf_dataset(plan: ReadPlan, batch: BatchOptions, order: ShuffleOptions, *,
               device: str | None = None, service: str | None = None,
               graph_reads: bool = True, epoch: int = 0) -> tf.data.Dataset:
    """The split's batches, shuffled as ``order`` says
    (:func:`windowkit.readers.choice.choose_shuffle`): uniformly (rows held
    once, batches gathered by random access), or groups of blocks in the
    sampler's order with windows cut in the graph; with
    ``service`` (a tf.data dispatcher's address), read by its workers. A
    batch's ``x`` is a dict of fields with ``return_series`` or known-future
    columns; ``device`` prefetches batches into that device's memory. The
    first iteration reads epoch ``epoch``, each further one the next epoch
    (:mod:`windowkit.readers.tfdata_engine.epochs`)."""
    import tensorflow as tf

    from windowkit.readers.tfdata_engine.epochs import EpochCounter, epoched, reader_guard

    fields = plan.store.fields(batch.return_series)
    choice = shuffle_choice(plan, order)
    if not choice.uniform:  # a uniform shuffle's batches warn themselves
        warn_if_no_batch(plan, batch)
    if service is not None:
        from windowkit.readers.tfdata_engine.service import service_batches

        return service_batches(plan, service=service, batch_size=batch.batch_size,
                               shuffle="global" if order.shuffle == "global"
                               else choice.mode != "ordered",
                               seed=order.seed, drop_remainder=batch.drop_remainder,
                               normalize=batch.normalize, cache_bytes=choice.cache_bytes,
                               fields=fields)
    per_epoch = plan.windows_per_epoch(batch.drop_remainder)
    if choice.uniform:
        from windowkit.readers.numpy_engine.batches import EpochBatches
        from windowkit.readers.tfdata_engine.uniform import uniform_epochs

        one_epoch = uniform_epochs(EpochBatches(plan, batch, order))
    else:
        from windowkit.readers.tfdata_engine.groups import BlockGroups

        groups = BlockGroups(plan, shuffle=choice.grouped, seed=order.seed,
                             shuffle_blocks=order.shuffle_blocks,
                             cache_bytes=choice.cache_bytes, with_series=fields.series,
                             graph_reads=graph_reads,
                             extra_windows=per_epoch - plan.num_windows)
        norm = plan.store.normalizer() if batch.normalize else None
        cutter = WindowCutter(plan.spec, norm, plan.store.target_positions, fields)

        def one_epoch(e: tf.Tensor) -> tf.data.Dataset:
            return cut_groups(groups.epoch(e), plan, cutter, batch_size=batch.batch_size,
                              drop_remainder=batch.drop_remainder, with_series=fields.series)

    batches = num_batches(per_epoch, batch.batch_size, batch.drop_remainder)

    saved = saved_for(plan, batch, order, epoch_order(plan, order, choice))
    guard = reader_guard(saved)

    def build(counter: EpochCounter, epochs: int | None) -> tf.data.Dataset:
        ds = counter.epochs(one_epoch, epochs, guard)
        ds = ds.apply(tf.data.experimental.assert_cardinality(
            tf.data.INFINITE_CARDINALITY if epochs is None else batches * epochs))
        ds = ds.prefetch(PREFETCH_BATCHES).with_options(checkpoint_options())
        return ds if device is None else prefetch_to_device(ds, device)

    return epoched(build, EpochCounter(epoch), saved)


def checkpoint_options() -> tf.data.Options:
    """Options that let ``tf.train.Checkpoint(iterator=...)`` save an iterator,
    symbolically: positions, not buffered batches. The reading function's state
    (open files, caches) is not part of it, since what it returns depends only
    on the block ids it is given."""
    import tensorflow as tf

    options = tf.data.Options()
    options.experimental_symbolic_checkpoint = True
    options.experimental_external_state_policy = (
        tf.data.experimental.ExternalStatePolicy.IGNORE)
    return options


def prefetch_to_device(ds: tf.data.Dataset, device: str) -> tf.data.Dataset:
    """Keep the next batches in ``device``'s memory (e.g. ``"/GPU:0"``), so a
    training step never waits for a host-to-device copy."""
    import tensorflow as tf

    try:
        name = tf.DeviceSpec.from_string(device).to_string()
    except ValueError:
        raise InvalidSpecError(f"device {device!r} is not a TensorFlow device name") from None
    available = [d.name for d in tf.config.list_logical_devices()]
    wanted = tf.DeviceSpec.from_string(device)
    if not any(_same_device(wanted, tf.DeviceSpec.from_string(d)) for d in available):
        raise InvalidSpecError(
            f"device {device!r} is not available on this machine; available: "
            f"{', '.join(available)}")
    return ds.apply(tf.data.experimental.prefetch_to_device(name))


def _same_device(wanted: Any, have: Any) -> bool:
    return bool(wanted.device_type and wanted.device_type.upper() == have.device_type.upper()
                and (wanted.device_index is None or wanted.device_index == have.device_index))
