"""The ``tf.data`` reader for Zarr and Parquet stores, and the graph pieces it
shares with the TFRecord reader.

Index batches -> blocks -> windows, with no Python per batch:

1. ``from_generator`` yields, per *group* of storage blocks, only the block
   ids (never data): one epoch's blocks in a seeded random order, taken
   ``shuffle_blocks`` at a time.
2. A ``map`` of a ``py_function`` reads each group's blocks, each with the
   ``span - 1`` rows that follow it (its halo), as one ``rows`` tensor; blocks
   that are neighbours on disk are read as one range. One Python call per
   group of megabytes, so its cost vanishes; it runs ahead of the consumer.
3. The group's window starts come from a ragged lookup of the split's index
   runs per block (graph ops), shuffled with ``stateless_shuffle``.
4. Batches are cut with one ``tf.gather`` each under a parallel ``map``, then
   ``rebatch`` -> ``assert_cardinality`` -> ``prefetch``.

How it shuffles: each epoch permutes the blocks, and the windows of
``shuffle_blocks`` blocks at a time are permuted together. When one group
holds every block (small stores, or a large ``cache_bytes``), each epoch is a
uniform permutation of the split.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from windowkit.errors import InvalidSpecError, StoreError
from windowkit.formats.base import RowReader
from windowkit.index import WindowRuns
from windowkit.order import num_batches
from windowkit.spec import WindowSpec
from windowkit.stats import Normalizer

if TYPE_CHECKING:
    import tensorflow as tf

    from windowkit.store import Store

PREFETCH_BATCHES = 8  # an autotuned buffer grew by ~35 MB here and gained nothing
GROUP_SHARE = 6  # a group's rows are held ~6 times (read-ahead, decode, cut, batches)


def default_group(shuffle_blocks: int | None, *, cache_bytes: int, block_bytes: int,
                  num_blocks: int) -> int:
    """Blocks whose windows are mixed together: ``shuffle_blocks``, else every
    block when the store fits ``cache_bytes / GROUP_SHARE``, else what does."""
    if shuffle_blocks is None:
        fits = cache_bytes // max(1, block_bytes * GROUP_SHARE)
        shuffle_blocks = num_blocks if fits >= num_blocks else max(1, fits)
    return max(1, min(shuffle_blocks, max(1, num_blocks)))


class BlockWindows:
    """The split's window starts in each block, as a graph-side ragged lookup."""

    def __init__(self, runs: WindowRuns, block_first: np.ndarray, block_rows: np.ndarray
                 ) -> None:
        import tensorflow as tf

        row_splits, first, count = runs.runs_per_block(block_first, block_rows)
        self.windows = np.bincount(np.repeat(np.arange(len(block_first)), np.diff(row_splits)),
                                   weights=count, minlength=len(block_first)).astype(np.int64)
        self.stride = runs.stride
        self._first = tf.RaggedTensor.from_row_splits(first, row_splits, validate=False)
        self._count = tf.RaggedTensor.from_row_splits(count, row_splits, validate=False)

    def starts(self, blocks: tf.Tensor, offsets: tf.Tensor) -> tf.Tensor:
        """Row positions, in a tensor holding block ``blocks[i]`` at row
        ``offsets[i]``, of the windows starting in those blocks (block order)."""
        import tensorflow as tf

        firsts = tf.gather(self._first, blocks)
        counts = tf.gather(self._count, blocks)
        within = tf.ragged.range(counts.flat_values)
        run = within.value_rowids()
        owner = tf.gather(firsts.value_rowids(), run)
        return (tf.gather(firsts.flat_values, run) + within.flat_values * self.stride
                + tf.gather(offsets, owner))


def batch_cutter(spec: WindowSpec, batch_size: int, norm: Normalizer | None,
                 targets: np.ndarray | None = None
                 ) -> Callable[[tf.Tensor, tf.Tensor], tf.data.Dataset]:
    """``cut(rows, starts)``: a dataset of batches of the windows starting at
    ``starts`` in ``rows``, each batch one ``tf.gather``, cut in parallel;
    targets keep the ``targets`` columns only (None: all)."""
    import tensorflow as tf

    input_offsets = tf.constant(np.arange(spec.length) * spec.sampling_rate, dtype=tf.int64)
    target_offsets = tf.constant(
        (spec.length + np.arange(spec.horizon)) * spec.sampling_rate, dtype=tf.int64)

    def cut_batch(rows: tf.Tensor, starts: tf.Tensor) -> Any:
        x = tf.gather(rows, starts[:, None] + input_offsets)
        y = tf.gather(rows, starts[:, None] + target_offsets) if spec.horizon else None
        if y is not None and targets is not None:
            y = tf.gather(y, targets, axis=2)
        if norm is not None:
            mean, scale = tf.constant(norm.mean), tf.constant(norm.scale)
            x = (tf.cast(x, mean.dtype) - mean) * scale
            if y is not None:
                y_norm = norm.select(targets)
                y = (tf.cast(y, mean.dtype) - y_norm.mean) * y_norm.scale
        return x if y is None else (x, y)

    def cut(rows: tf.Tensor, starts: tf.Tensor) -> tf.data.Dataset:
        n = tf.size(starts, out_type=tf.int64)
        return tf.data.Dataset.range(0, n, batch_size).map(
            lambda lo: cut_batch(rows, starts[lo:lo + batch_size]),
            num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)

    return cut


def batches_from_groups(groups: tf.data.Dataset, store: Store, *, windows: int,
                        batch_size: int, drop_remainder: bool, normalize: bool
                        ) -> tf.data.Dataset:
    """From ``(rows, starts)`` groups to the reader's batches: cut (and normalize)
    windows, ``rebatch`` across groups, declare the count, prefetch."""
    import tensorflow as tf

    norm = store.normalizer() if normalize else None
    ds = groups.flat_map(batch_cutter(store.spec, batch_size, norm, store.target_index))
    ds = ds.rebatch(batch_size, drop_remainder=drop_remainder)
    ds = ds.apply(tf.data.experimental.assert_cardinality(
        num_batches(windows, batch_size, drop_remainder)))
    return ds.prefetch(PREFETCH_BATCHES)


class GroupLoader:
    """Reads a group of blocks, each with its halo, into one array of rows."""

    def __init__(self, reader: RowReader, *, total_rows: int, halo: int) -> None:
        self.reader = reader
        self.block_rows = reader.block_rows
        self.total_rows = total_rows
        self.halo = halo
        self._lock = threading.Lock()  # readers keep open files: one read at a time

    def __call__(self, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(rows, offsets)``: block ``blocks[i]`` (ascending) starts at
        ``rows[offsets[i]]`` and is followed by its halo. Runs of neighbouring
        blocks are read with one call and share their rows."""
        size = self.block_rows
        breaks = np.flatnonzero(np.diff(blocks) != 1) + 1
        heads = np.concatenate([[0], breaks])
        ends = np.concatenate([breaks, [len(blocks)]])
        lo = blocks[heads] * size
        hi = np.minimum(self.total_rows, (blocks[ends - 1] + 1) * size + self.halo)
        run_offset = np.concatenate([[0], np.cumsum(hi - lo)])
        offsets = (np.repeat(run_offset[:-1] - lo, ends - heads) + blocks * size).astype(np.int64)
        with self._lock:
            parts = [self.reader.read_rows(int(a), int(b)) for a, b in zip(lo, hi, strict=True)]
        for k, part in enumerate(parts):  # a short read would shift every later block
            if len(part) != hi[k] - lo[k]:
                first, last = int(blocks[heads[k]]), int(blocks[ends[k] - 1])
                which = f"block {first}" if first == last else f"blocks {first}..{last}"
                raise StoreError(f"{which} (rows {lo[k]}..{hi[k]}): the store returned "
                                 f"{len(part)} rows, expected {hi[k] - lo[k]}")
        rows = parts[0] if len(parts) == 1 else np.concatenate(parts)
        return rows, offsets


def make_tf_dataset(store: Store, split: str, *, batch_size: int, shuffle: bool, seed: int,
                    drop_remainder: bool, normalize: bool, shuffle_blocks: int | None,
                    cache_bytes: int, stage: str = "batches") -> tf.data.Dataset:
    import tensorflow as tf

    runs = store.runs(split)
    spec, step_shape, manifest = store.spec, store.step_shape, store.manifest
    reader = store.row_reader()
    block_rows, total_rows = reader.block_rows, manifest.total_rows
    num_blocks = -(-total_rows // block_rows)
    block_first = np.arange(num_blocks, dtype=np.int64) * block_rows
    windows = BlockWindows(runs, block_first,
                           np.minimum(block_rows, total_rows - block_first))
    useful = np.flatnonzero(windows.windows > 0)  # only blocks where split windows start
    row_bytes = store.dtype.itemsize * int(np.prod(step_shape, dtype=np.int64))
    group = default_group(shuffle_blocks, cache_bytes=cache_bytes,
                          block_bytes=(block_rows + spec.span - 1) * row_bytes,
                          num_blocks=len(useful))
    epochs = itertools.count()

    def block_groups() -> Iterator[tuple[np.ndarray, np.int64]]:
        rng = np.random.default_rng([seed, next(epochs)])
        order = rng.permutation(useful) if shuffle else useful
        for lo in range(0, len(order), group):
            key = rng.integers(0, 2**63, dtype=np.int64)
            yield np.sort(order[lo:lo + group]), key

    loader = GroupLoader(reader, total_rows=total_rows, halo=spec.span - 1)
    dtype = tf.as_dtype(store.dtype)

    def load(blocks: tf.Tensor, key: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        rows, offsets = tf.py_function(lambda b: loader(b.numpy()), [blocks],
                                       [dtype, tf.int64])
        rows = tf.ensure_shape(rows, [None, *step_shape])
        starts = windows.starts(blocks, tf.ensure_shape(offsets, [None]))
        if shuffle:
            starts = tf.random.experimental.stateless_shuffle(
                starts, seed=tf.stack([tf.constant(seed, tf.int64), key]))
        return rows, starts

    ds = tf.data.Dataset.from_generator(block_groups, output_signature=(
        tf.TensorSpec(shape=(None,), dtype=tf.int64), tf.TensorSpec(shape=(), dtype=tf.int64)))
    # one group read at a time (bounded memory), ahead of the cuts of the previous one
    ds = ds.map(load, num_parallel_calls=1, deterministic=True)
    if stage == "blocks":  # the read + decode stage alone (for `windowkit bench`)
        return ds
    return batches_from_groups(ds, store, windows=runs.total, batch_size=batch_size,
                               drop_remainder=drop_remainder, normalize=normalize)


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
