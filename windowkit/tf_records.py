"""The pure-graph ``tf.data`` reader for TFRecord stores (DESIGN §5).

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

from typing import TYPE_CHECKING, Any

import numpy as np

from windowkit.formats.tfrecord_rows import TFRecordRowReader
from windowkit.index import WindowRuns
from windowkit.order import num_batches

if TYPE_CHECKING:
    import tensorflow as tf

    from windowkit.store import Store

MAX_CYCLE_LENGTH = 4  # shards read at once when shuffling
PREFETCH_BATCHES = 8  # an autotuned buffer grew by ~35 MB here and gained nothing
GROUP_SHARE = 6  # a group's rows are held ~6 times (buffer, batch, parse, decode)


def _decoded_type(dtype: tf.DType) -> tf.DType:
    """The type ``decode_raw`` reads ``dtype`` as: itself where the op supports it
    (with ``fixed_length``), else an integer of the same size to bitcast."""
    import tensorflow as tf

    supported = {tf.float32, tf.float64, tf.bfloat16, tf.int64, tf.int32, tf.int16, tf.int8,
                 tf.uint16, tf.uint8}
    if dtype in supported:
        return dtype
    return {1: tf.uint8, 2: tf.uint16, 4: tf.int32, 8: tf.int64}[dtype.size]


def windows_per_record(runs: WindowRuns, record_first: np.ndarray, record_rows: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The split's windows whose start lies in each record, as runs.

    Returns ``(row_splits, first, count)``: record ``i`` holds runs
    ``row_splits[i]:row_splits[i+1]``, each ``count`` windows starting at record
    rows ``first + k * stride``. Vectorized; size grows with runs, not windows.
    """
    low, high = record_first, record_first + record_rows
    lo = np.searchsorted(runs.global_last, low, side="left")
    hi = np.searchsorted(runs.global_first, high, side="left")
    per_record = np.maximum(hi - lo, 0)
    total = int(per_record.sum())
    record = np.repeat(np.arange(len(low)), per_record)
    run = np.repeat(lo, per_record) + (
        np.arange(total) - np.repeat(np.cumsum(per_record) - per_record, per_record))
    stride = runs.stride
    first, count = runs.global_first[run], runs.count[run]
    k_lo = np.clip(-((first - low[record]) // stride), 0, count)
    k_hi = np.clip(-((first - high[record]) // stride), 0, count)
    keep = k_hi > k_lo
    local_first = (first + k_lo * stride - low[record])[keep]
    record = record[keep]
    row_splits = np.concatenate([[0], np.cumsum(np.bincount(record, minlength=len(low)))])
    return row_splits.astype(np.int64), local_first.astype(np.int64), (k_hi - k_lo)[keep]


def make_record_dataset(store: Store, split: str, *, batch_size: int, shuffle: bool, seed: int,
                        drop_remainder: bool, normalize: bool, shuffle_blocks: int | None,
                        cache_bytes: int) -> tf.data.Dataset:
    import tensorflow as tf

    manifest, spec, step_shape = store.manifest, store.spec, store.step_shape
    reader = store.row_reader()
    assert isinstance(reader, TFRecordRowReader)
    records = reader.records
    runs = store.runs(split)
    row_splits, first, count = windows_per_record(runs, records["global_row"], records["rows"])
    slot_rows = int(manifest.data["slot_rows"])
    row_items = int(np.prod(step_shape, dtype=np.int64))
    slot_bytes = slot_rows * row_items * store.dtype.itemsize
    num_records = len(records)
    if shuffle_blocks is None:
        fits = cache_bytes // max(1, slot_bytes * GROUP_SHARE)
        shuffle_blocks = num_records if fits >= num_records else max(1, fits)
    group = max(1, min(shuffle_blocks, num_records))

    lookup_first = tf.RaggedTensor.from_row_splits(first, row_splits, validate=False)
    lookup_count = tf.RaggedTensor.from_row_splits(count, row_splits, validate=False)
    dtype = tf.as_dtype(store.dtype)
    raw_dtype = _decoded_type(dtype)
    norm = store.normalizer() if normalize else None
    input_offsets = tf.constant(np.arange(spec.length) * spec.sampling_rate, dtype=tf.int64)
    target_offsets = tf.constant(
        (spec.length + np.arange(spec.horizon)) * spec.sampling_rate, dtype=tf.int64)
    features = {"record": tf.io.FixedLenFeature([], tf.int64),
                "data": tf.io.FixedLenFeature([], tf.string)}

    def decode_group(serialized: tf.Tensor, key: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """Rows of a group of records, and the window starts (rows) cut from them."""
        parsed = tf.io.parse_example(serialized, features)
        raw = tf.io.decode_raw(parsed["data"], raw_dtype, little_endian=True,
                               fixed_length=slot_bytes)
        rows = tf.reshape(tf.bitcast(raw, dtype) if raw_dtype != dtype else raw,
                          [-1, *step_shape])
        firsts = tf.gather(lookup_first, parsed["record"])
        counts = tf.gather(lookup_count, parsed["record"])
        within = tf.ragged.range(counts.flat_values)
        run = within.value_rowids()
        owner = tf.gather(firsts.value_rowids(), run)
        starts = (tf.gather(firsts.flat_values, run) + within.flat_values * spec.stride
                  + owner * slot_rows)
        if shuffle:
            starts = tf.random.experimental.stateless_shuffle(
                starts, seed=tf.stack([tf.constant(seed, tf.int64), key]))
        return rows, starts

    def cut(rows: tf.Tensor, starts: tf.Tensor) -> Any:
        x = tf.gather(rows, starts[:, None] + input_offsets)
        y = tf.gather(rows, starts[:, None] + target_offsets) if spec.horizon else None
        if norm is not None:
            mean, scale = tf.constant(norm.mean), tf.constant(norm.scale)
            x = (tf.cast(x, mean.dtype) - mean) * scale
            y = (tf.cast(y, mean.dtype) - mean) * scale if y is not None else None
        return x if y is None else (x, y)

    def batches_of(rows: tf.Tensor, starts: tf.Tensor) -> tf.data.Dataset:
        n = tf.size(starts, out_type=tf.int64)
        return tf.data.Dataset.range(0, n, batch_size).map(
            lambda lo: cut(rows, starts[lo:lo + batch_size]),
            num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)

    compression = "GZIP" if manifest.data.get("compression") == "gzip" else ""
    paths = [str(store.path / shard["path"]) for shard in manifest.data["shards"]]
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
    ds = ds.map(decode_group)  # one group at a time: memory; the cuts run in parallel
    ds = ds.flat_map(batches_of)
    ds = ds.rebatch(batch_size, drop_remainder=drop_remainder)
    ds = ds.apply(tf.data.experimental.assert_cardinality(
        num_batches(runs.total, batch_size, drop_remainder)))
    return ds.prefetch(PREFETCH_BATCHES)
