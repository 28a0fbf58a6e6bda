"""``tf.data`` service: a split read by the graph alone, so that remote tf.data
workers (TensorFlow, no windowkit) can run it.

The NumPy path reads rows with the format's Python row reader (in a
``numpy_function``), which does not travel to a tf.data worker; the graph
path of TFRecord block groups (:mod:`windowkit.readers.tfdata.reads`)
has no Python but reads the sampler's groups in one process. A format whose
files TensorFlow reads by itself offers a graph reader
(``open_graph_reader``: TFRecord, through ``TFRecordDataset``); then:

1. the part files holding pieces (one series inside one block, with its
   halo) with windows of the split are the pipeline's source: the service
   hands them out among its workers, each file to one worker per epoch;
2. each piece's windows are cut in one ``tf.gather`` (a graph-side lookup
   from piece to window starts, as in block groups), then mixed in a shuffle
   buffer of about ``cache_bytes`` and batched on the worker;
3. on the trainer, ``rebatch``: the workers' last, partial batches are merged,
   so every batch but the epoch's last is full.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from windowkit.errors import InvalidSpecError
from windowkit.formats.base import ReadsInGraph
from windowkit.location import is_remote
from windowkit.readers.fields import BatchFields
from windowkit.readers.tfdata.cut import PREFETCH_BATCHES, window_cutter

if TYPE_CHECKING:
    import tensorflow as tf

    from windowkit.readers.plan import ReadPlan


def check_service_plan(plan: ReadPlan, *, shuffle: bool | str) -> None:
    """One line if ``plan`` cannot be read through the tf.data service."""
    if not isinstance(plan.store.storage, ReadsInGraph):
        raise InvalidSpecError(
            f"{plan.store.path}: service= needs a store TensorFlow reads by itself (TFRecord); "
            f"this {plan.store.format} store is read by Python (the format's row reader), which "
            "tf.data workers cannot run; convert with --format tfrecord, or read without "
            "the service")
    if shuffle == "global":
        raise InvalidSpecError("service= shuffles through a buffer on each worker; "
                               "shuffle='global' is not available with it")
    if is_remote(plan.store.path):
        raise InvalidSpecError(f"{plan.store.path}: service= reads stores on a file system the "
                               "tf.data workers share, not on object storage")
    if plan.shard != (0, 1):
        raise InvalidSpecError("service= splits the files among its workers itself; do "
                               "not pass num_shards/shard_index or input_context")


def service_batches(plan: ReadPlan, *, service: str, batch_size: int, shuffle: bool | str,
                    seed: int, drop_remainder: bool, normalize: bool, cache_bytes: int,
                    fields: BatchFields) -> tf.data.Dataset:
    """The split's batches, read by the tf.data service's workers at ``service``
    (a dispatcher address); each iteration is a new epoch."""
    import tensorflow as tf

    check_service_plan(plan, shuffle=shuffle)
    ds = worker_pipeline(plan, batch_size=batch_size, shuffle=bool(shuffle), seed=seed,
                         normalize=normalize, cache_bytes=cache_bytes, fields=fields)
    ds = ds.apply(tf.data.experimental.service.distribute(
        processing_mode=tf.data.experimental.service.ShardingPolicy.DYNAMIC,
        service=service))
    return ds.rebatch(batch_size, drop_remainder=drop_remainder).prefetch(PREFETCH_BATCHES)


def worker_pipeline(plan: ReadPlan, *, batch_size: int, shuffle: bool, seed: int,
                    normalize: bool, cache_bytes: int, fields: BatchFields
                    ) -> tf.data.Dataset:
    """What each tf.data worker runs: the pieces of the store holding windows of
    the split -> their windows -> shuffled batches, all in the graph."""
    import tensorflow as tf

    from windowkit.readers.tfdata.groups import BlockWindows

    storage = plan.store.storage
    assert isinstance(storage, ReadsInGraph)  # check_service_plan said so
    reader = storage.open_graph_reader(
        plan.store.path / "data", plan.store.data, plan.store.reader_setup())
    lookup = BlockWindows(plan.runs, reader.piece_first_row, reader.piece_rows)
    # tf.gather, not windowkit's op: a remote worker has not loaded it
    cut = window_cutter(plan.spec, plan.store.normalizer() if normalize else None,
                        plan.store.target_positions, fields, native=False)
    row_offset = tf.constant(plan.runs.row_offset, tf.int64)
    piece_first = tf.constant(reader.piece_first_row, tf.int64)

    def piece_windows(piece: tf.Tensor, rows: tf.Tensor) -> tf.Tensor:
        starts = lookup.starts(piece[None], tf.zeros([1], tf.int64))
        first_row = tf.gather(piece_first, piece)  # a piece is one series: one id
        series = tf.fill(tf.shape(starts), tf.searchsorted(
            row_offset, first_row[None], side="right")[0] - 1) if fields.series else None
        return cut(rows, starts, series)

    ds = reader.pieces(lookup.windows > 0, shuffle=shuffle, seed=seed)
    ds = ds.map(tf.autograph.experimental.do_not_convert(piece_windows),
                num_parallel_calls=tf.data.AUTOTUNE,
                deterministic=not shuffle).unbatch()
    if shuffle:
        window_bytes = plan.spec.span * plan.layout.row_bytes
        ds = ds.shuffle(max(batch_size, cache_bytes // window_bytes), seed=seed,
                        reshuffle_each_iteration=True)
    return ds.batch(batch_size)
