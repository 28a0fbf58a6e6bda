"""The pure-graph ``tf.data`` reader for TFRecord stores.

shard files -> ``interleave(TFRecordDataset, num_parallel_calls=AUTOTUNE)`` ->
shuffle records -> group records -> parse + ``decode_raw`` each group -> join
the group's records with their windows of the split (a ragged lookup table
built from the index) -> cut batches with one ``tf.gather`` each -> ``rebatch``
-> ``prefetch``. No Python runs per batch: every step is a TensorFlow op.

How it shuffles (``shuffle=True``): each epoch the shard order is permuted,
``cycle_length`` shards are read interleaved, records pass a shuffle buffer of
``2 * shuffle_blocks`` records, and then the windows of ``shuffle_blocks``
records (blocks) at a time are permuted together. A window's batch-mates therefore
come from ``shuffle_blocks`` blocks drawn from the shards being read; when the
group holds every record of the store, each epoch is a uniform permutation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from windowkit.formats.base import store_tag
from windowkit.formats.tf_blocks import BlockWindows, default_group

if TYPE_CHECKING:
    import tensorflow as tf

    from windowkit.formats.tfrecord_rows import RecordTable
    from windowkit.readers.plan import ReadPlan

MAX_CYCLE_LENGTH = 4  # shards read at once when shuffling


def _decoded_type(dtype: tf.DType) -> tf.DType:
    """The type ``decode_raw`` reads ``dtype`` as: itself where the op's CPU kernel
    supports it (with ``fixed_length``), else an unsigned or signed integer of the
    same size (see :func:`_from_raw`)."""
    import tensorflow as tf

    supported = {tf.float32, tf.float64, tf.bfloat16, tf.int64, tf.int32, tf.int16, tf.int8,
                 tf.uint16, tf.uint8}
    if dtype in supported:
        return dtype
    return {1: tf.uint8, 2: tf.uint16, 4: tf.int32, 8: tf.int64}[dtype.size]


def _from_raw(raw: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """``raw`` (decoded as ``_decoded_type(dtype)``) as ``dtype``, bit for bit:
    a bitcast (float16, uint32, uint64), or for bool, which ``tf.bitcast``
    refuses, a comparison of its bytes (NumPy writes bools as bytes 0 and 1)."""
    import tensorflow as tf

    if raw.dtype == dtype:
        return raw
    if dtype == tf.bool:
        return tf.not_equal(raw, tf.constant(0, raw.dtype))
    return tf.bitcast(raw, dtype)


def record_groups(plan: ReadPlan, records: RecordTable, *, shuffle: bool, seed: int,
                  shuffle_blocks: int | None, cache_bytes: int) -> tf.data.Dataset:
    """Groups of records (``records.parquet``) read and decoded in the graph:
    ``(rows, starts)``."""
    import tensorflow as tf

    step_shape = plan.step_shape
    windows = BlockWindows(plan.runs, records["global_row"], records["rows"])
    slot_rows = int(plan.data["slot_rows"])
    slot_bytes = slot_rows * plan.row_bytes
    group = default_group(shuffle_blocks, cache_bytes=cache_bytes, block_bytes=slot_bytes,
                          num_blocks=len(records))
    dtype = tf.as_dtype(plan.dtype)
    raw_dtype = _decoded_type(dtype)
    features = {"record": tf.io.FixedLenFeature([], tf.int64),
                "store": tf.io.FixedLenFeature([], tf.int64),
                "data": tf.io.FixedLenFeature([], tf.string)}
    tag = store_tag(plan.store_id)
    replaced = (f"{plan.path}: the store was replaced while it was being read (a record "
                f"of another store, expected store tag {tag}); open it again")

    def decode_group(serialized: tf.Tensor, key: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """Rows of a group of records, and the window starts (rows) cut from them."""
        parsed = tf.io.parse_example(serialized, features)
        same_store = tf.debugging.assert_equal(
            parsed["store"], tf.constant(tag, tf.int64), message=replaced)
        with tf.control_dependencies([same_store]):
            parsed = {name: tf.identity(value) for name, value in parsed.items()}
        raw = tf.io.decode_raw(parsed["data"], raw_dtype, little_endian=True,
                               fixed_length=slot_bytes)
        rows = tf.reshape(_from_raw(raw, dtype), [-1, *step_shape])
        ids = parsed["record"]
        starts = windows.starts(ids, tf.range(tf.size(ids, out_type=tf.int64)) * slot_rows)
        if shuffle:
            starts = tf.random.experimental.stateless_shuffle(
                starts, seed=tf.stack([tf.constant(seed, tf.int64), key]))
        return rows, starts

    compression = "GZIP" if plan.data["compression"] == "gzip" else ""
    paths = [str(plan.path / shard["path"]) for shard in plan.data["shards"]]
    cycle = min(len(paths), MAX_CYCLE_LENGTH) if shuffle else 1
    files = tf.data.Dataset.from_tensor_slices(paths)
    if shuffle:
        files = files.shuffle(len(paths), seed=seed, reshuffle_each_iteration=True)
    ds = files.interleave(
        lambda path: tf.data.TFRecordDataset(path, compression_type=compression),
        cycle_length=cycle, block_length=1, num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True)
    if shuffle:
        ds = ds.shuffle(2 * group, seed=seed, reshuffle_each_iteration=True)
    ds = ds.batch(group)
    keys = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True)
    ds = tf.data.Dataset.zip(ds, keys)
    return ds.map(decode_group)  # one group at a time: memory; the cuts run in parallel
