"""The ``tf.data`` reader for random-access stores (DESIGN §5).

``from_generator`` yields only index batches (the global start rows of the
windows); a parallel ``map`` of a ``py_function`` resolves each with one
vectorized gather over a shared block cache; ``ensure_shape`` restores static
shapes; the cardinality is asserted; batches are prefetched.

A ``py_function`` call costs far more than gathering one batch, so each index
batch covers several training batches (about ``RESOLVE_BYTES`` of windows) and
``rebatch`` cuts the result into ``batch_size`` batches. The epoch's window
order is the same as with one call per batch.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import numpy as np

from windowkit.errors import InvalidSpecError
from windowkit.order import epoch_batches, num_batches

RESOLVE_BYTES = 2 << 20  # windows resolved per py_function call

if TYPE_CHECKING:
    import tensorflow as tf

    from windowkit.store import Store


def make_tf_dataset(store: Store, split: str, *, batch_size: int, shuffle: bool, seed: int,
                    drop_remainder: bool, normalize: bool, shuffle_blocks: int | None,
                    cache_bytes: int) -> tf.data.Dataset:
    import tensorflow as tf

    runs = store.runs(split)
    gather = store.window_gather(cache_bytes)
    group = gather.blocks_per_group if shuffle_blocks is None else shuffle_blocks
    if group > gather.blocks_per_group:
        raise InvalidSpecError(
            f"shuffle_blocks={group} needs a larger cache: cache_bytes={cache_bytes} holds "
            f"{gather.blocks_per_group} groupable blocks"
        )
    spec = store.spec
    norm = store.normalizer() if normalize else None
    out_dtype = tf.as_dtype(norm.dtype if norm is not None else store.dtype)
    epochs = itertools.count()
    window_bytes = np.dtype(out_dtype.as_numpy_dtype).itemsize * spec.steps * int(
        np.prod(store.step_shape, dtype=np.int64))
    batches_per_call = int(np.clip(RESOLVE_BYTES // max(1, window_bytes * batch_size), 1, 16))

    def index_batches() -> Any:
        yield from epoch_batches(
            runs, batch_size=batch_size * batches_per_call, shuffle=shuffle, seed=seed,
            epoch=next(epochs), block_rows=gather.pool.block_rows,
            total_rows=store.manifest.total_rows, blocks_per_group=group,
            drop_remainder=False)

    def resolve(starts: tf.Tensor) -> list[np.ndarray]:
        x, y = gather(starts.numpy())
        if norm is not None:
            x = norm(x)
            y = norm(y) if y is not None else None
        return [x] if y is None else [x, y]

    outputs = [out_dtype] if spec.horizon == 0 else [out_dtype, out_dtype]
    x_shape = (None, spec.length, *store.step_shape)
    y_shape = (None, spec.horizon, *store.step_shape)

    def resolve_batch(starts: tf.Tensor) -> Any:
        tensors = tf.py_function(resolve, [starts], outputs)
        x = tf.ensure_shape(tensors[0], x_shape)
        if spec.horizon == 0:
            return x
        return x, tf.ensure_shape(tensors[1], y_shape)

    ds = tf.data.Dataset.from_generator(
        index_batches, output_signature=tf.TensorSpec(shape=(None,), dtype=tf.int64))
    ds = ds.map(resolve_batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    ds = ds.rebatch(batch_size, drop_remainder=drop_remainder)
    ds = ds.apply(tf.data.experimental.assert_cardinality(
        num_batches(runs.total, batch_size, drop_remainder)))
    return ds.prefetch(tf.data.AUTOTUNE)


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
