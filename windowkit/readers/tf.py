"""The ``tf.data`` reader: a store's blocks -> windows -> batches, with no Python
per batch.

1. Groups of blocks in the sampler's order (:mod:`windowkit.readers.tfdata.groups`):
   ``(rows, starts)``, the rows of a group of storage blocks with their halos
   and the positions of the split's windows starting in them, shuffled within
   the group when asked. Where the rows are read
   (:mod:`windowkit.readers.tfdata.reads`): a local, uncompressed
   TFRecord store in TensorFlow's own ops (ranged ``TFRecordDataset`` reads
   under a parallel ``interleave``, records and block digests checked in the
   graph, no Python per group); every other store (Zarr, Parquet, GZIP
   TFRecord parts, object storage) through the format's row reader, one
   ``numpy_function`` call per group.
2. Batches are cut with one window copy per part under a parallel ``map``
   (:func:`windowkit.native.window_copy`), normalized in the graph when
   asked; the windows left at a group's end are carried into the next group's
   first batch (:mod:`windowkit.readers.tfdata.carry`, no ``rebatch``), then
   ``assert_cardinality`` -> ``prefetch`` (optionally onto a GPU).

How it shuffles (:func:`windowkit.readers.epoch.choice.choose_shuffle`): uniformly
when asked (``"global"``) or when the split's rows fit the memory budget
(:mod:`windowkit.readers.tfdata.uniform`: rows held once, in memory or
spilled, every format, chunks of batches cut from them in the graph, then an
autotuned ``prefetch``); else
block groups: each epoch permutes the blocks holding windows of the split,
and the windows of ``shuffle_blocks`` blocks at a time (as many as the
budget holds) are permuted together.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from windowkit.errors import InvalidSpecError, check_int
from windowkit.readers import num_batches
from windowkit.readers.epoch.choice import epoch_order, shuffle_choice
from windowkit.readers.epoch.saved import saved_for
from windowkit.readers.fields import BatchFields
from windowkit.readers.options import (
    BatchOptions,
    ShardOptions,
    ShuffleOptions,
)
from windowkit.readers.plan import PlanSource
from windowkit.readers.tfdata.cut import PREFETCH_BATCHES, WindowCutter
from windowkit.spec import WindowSpec
from windowkit.stats import Normalizer

if TYPE_CHECKING:
    import tensorflow as tf

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

    from windowkit.readers.tfdata.carry import carried_batches

    empty_rows = tf.zeros([plan.spec.span, *plan.layout.step_shape], tf.as_dtype(plan.layout.dtype))
    return carried_batches(groups, cutter, batch_size=batch_size,
                           drop_remainder=drop_remainder, empty_rows=empty_rows,
                           with_series=with_series)


def split_dataset(plan: ReadPlan, batch: BatchOptions, order: ShuffleOptions, *,
                  device: str | None = None, service: str | None = None,
                  graph_reads: bool = True, epoch: int = 0) -> tf.data.Dataset:
    """The split's batches, shuffled as ``order`` says
    (:func:`windowkit.readers.epoch.choice.choose_shuffle`): uniformly (rows held
    once, batches gathered by random access), or groups of blocks in the
    sampler's order with windows cut in the graph; with
    ``service`` (a tf.data dispatcher's address), read by its workers. A
    batch's ``x`` is a dict of fields with ``return_series`` or known-future
    columns; ``device`` prefetches batches into that device's memory. The
    first iteration reads epoch ``epoch``, each further one the next epoch
    (:mod:`windowkit.readers.tfdata.epochs`)."""
    import tensorflow as tf

    from windowkit.readers.tfdata.epochs import EpochCounter, epoched, reader_guard

    fields = plan.store.fields(batch.return_series)
    choice = shuffle_choice(plan, order)
    if not choice.uniform:  # a uniform shuffle's batches warn themselves
        plan.warn_if_no_batch(batch)
    if service is not None:
        from windowkit.readers.tfdata.service import service_batches

        return service_batches(plan, service=service, batch_size=batch.batch_size,
                               shuffle="global" if order.shuffle == "global"
                               else choice.mode != "ordered",
                               seed=order.seed, drop_remainder=batch.drop_remainder,
                               normalize=batch.normalize, cache_bytes=choice.cache_bytes,
                               fields=fields)
    per_epoch = plan.windows_per_epoch(batch.drop_remainder)
    if choice.uniform:
        from windowkit.readers.epoch.batches import EpochBatches
        from windowkit.readers.tfdata.uniform import uniform_epochs

        one_epoch = uniform_epochs(EpochBatches(plan, batch, order))
    else:
        from windowkit.readers.tfdata.groups import BlockGroups

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
        # a uniform epoch's batches are slices of chunks cut ahead: an autotuned
        # buffer of them spares the consumer most waits (measured: 13-16% less CPU)
        ds = ds.prefetch(tf.data.AUTOTUNE if choice.uniform else PREFETCH_BATCHES)
        ds = ds.with_options(checkpoint_options())
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


class TfDatasetReader(PlanSource):
    """:meth:`tf_dataset`, a method of :class:`windowkit.Store`."""

    def tf_dataset(self, split: str = "train", batch_size: int = 256, *,
                   shuffle: bool | str = True, seed: int = 0, drop_remainder: bool = False,
                   normalize: bool = False, memory_budget: int | None = None,
                   spill_dir: str | os.PathLike[str] | None = None,
                   num_shards: int | None = None, shard_index: int | None = None,
                   input_context: Any = None, device: str | None = None,
                   service: str | None = None, return_series: bool = False,
                   shuffle_blocks: int | None = None, cache_bytes: int | None = None,
                   epoch: int = 0) -> tf.data.Dataset:
        """A ``tf.data.Dataset`` of batches of windows: ``x``, or ``(x, y)`` with a horizon.

        Every window of the split comes once per epoch; each iteration of the
        dataset read to its end moves on to the next epoch (the first is
        ``epoch``), each epoch's order fixed by ``seed`` and the epoch, as in
        every other reader. An iterator saves and restores with
        ``tf.train.Checkpoint`` (its epoch too). With
        known-future or static columns in the store, or ``return_series``,
        ``x`` is a dict ``{"inputs", "future_known", "static", "series"}``
        (the keys configured).

        :param split: the split to read (``store.splits``).
        :param batch_size: windows per batch (the global batch with ``input_context``).
        :param shuffle: ``True`` (default): the best mixing ``memory_budget``
            allows: each epoch a uniform permutation of the split's windows when
            its rows fit the budget, else block groups as large as it holds;
            ``"global"``: a uniform permutation at any size, the rows beyond the
            budget spilled once to local disk and read by random access;
            ``"blocks"``: block groups; ``False``: index order.
        :param seed: fixes every epoch's order.
        :param drop_remainder: leave out the last, smaller batch of an epoch.
        :param normalize: ``(x - mean) / std`` with the training rows' statistics.
        :param memory_budget: bytes the reader may hold (default: a quarter of
            the available memory, at most 16 GiB).
        :param spill_dir: where a uniform shuffle beyond the budget writes its
            private, unlinked file (default ``$WINDOWKIT_SPILL_DIR``, else the
            temporary directory).
        :param num_shards: read one shard of ``num_shards`` (with ``shard_index``):
            a contiguous piece of the split's index, within one window of every
            other shard's, in the whole split's order of the epoch; every shard
            yields as many batches (one short shard repeats its last window, or
            with ``drop_remainder`` one long shard leaves its last one out).
        :param shard_index: which shard, ``0 .. num_shards - 1``.
        :param input_context: a ``tf.distribute.InputContext``: picks the shard
            and turns the global ``batch_size`` into the replica's.
        :param device: e.g. ``"/GPU:0"``: prefetch batches into that device's memory.
        :param service: a tf.data dispatcher's address (TFRecord stores): the
            split's files are read by the service's workers, each file by one
            worker per epoch, windows mixed in a buffer of ``cache_bytes``.
        :param return_series: add each window's series id to ``x``.
        :param shuffle_blocks: experts: blocks per group (implies block groups).
        :param cache_bytes: experts: bytes of blocks a block group holds
            (implies block groups).
        :param epoch: the epoch the first iteration reads (to go on from a
            known epoch, as ``set_epoch`` does for PyTorch).
        """
        batch = BatchOptions.checked(batch_size, drop_remainder=drop_remainder,
                                     normalize=normalize, return_series=return_series)
        order = ShuffleOptions.checked(shuffle, seed=seed, memory_budget=memory_budget,
                                       spill_dir=spill_dir, cache_bytes=cache_bytes,
                                       shuffle_blocks=shuffle_blocks)
        shard = ShardOptions.checked(num_shards, shard_index, input_context=input_context)
        if input_context is not None:
            try:
                batch = replace(batch, batch_size=int(
                    input_context.get_per_replica_batch_size(batch.batch_size)))
            except ValueError as exc:  # not divisible by the replicas
                raise InvalidSpecError(f"batch_size: {exc}") from None
        return split_dataset(self._shard_plan(split, shard), batch, order, device=device,
                             service=service, epoch=check_int("epoch", epoch, 0))
