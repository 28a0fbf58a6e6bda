"""TFRecord parts (data files) read by TensorFlow's own ops, with no Python per record:
what a tf.data service worker can run (it has TensorFlow, not windowkit).

``TFRecordDataset`` checks each record's CRCs; each record is parsed in the
graph, refused if it belongs to another store, and decoded into its rows
(block and halo). Only the part files holding wanted records are opened.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from windowkit.formats.base import ReaderSetup, store_tag

if TYPE_CHECKING:
    import tensorflow as tf

RECORD_FILES_AT_ONCE = 4  # part files read from at once


class TFRecordGraphReader:
    """The store's pieces (records: one series inside one block, with its halo)
    as a ``tf.data`` pipeline."""

    def __init__(self, data_dir: Path, data: dict[str, Any], setup: ReaderSetup,
                 records: Any) -> None:
        self._root = data_dir.parent
        self._data = data
        self._setup = setup
        self._records = records  # the checked records table (``RecordTable``)

    @property
    def piece_first_row(self) -> np.ndarray:
        """Global row of each piece's first row."""
        return self._records["global_row"]

    @property
    def piece_rows(self) -> np.ndarray:
        """Rows of each piece (without its halo)."""
        return self._records["rows"]

    def pieces(self, wanted: np.ndarray, *, shuffle: bool, seed: int) -> tf.data.Dataset:
        """``(piece, rows)`` for each piece where ``wanted`` is true, reading only
        the part files that hold such pieces (in a seeded random order when
        ``shuffle``). The file list is the pipeline's source, so the tf.data
        service can hand the files out among its workers."""
        import tensorflow as tf

        # "shard" and "shards": the on-disk names of the parts (data files), kept
        files = np.unique(self._records["shard"][wanted])
        paths = [str(self._root / self._data["shards"][int(i)]["path"]) for i in files]
        keep = tf.constant(np.asarray(wanted, dtype=bool))
        compression = "GZIP" if self._data.get("compression") == "gzip" else ""
        dtype = tf.as_dtype(self._setup.rows.dtype.newbyteorder("="))
        step_shape = list(self._setup.rows.step_shape)
        tag = tf.constant(store_tag(self._setup.store_id), tf.int64)
        where = str(self._root)
        features = {"record": tf.io.FixedLenFeature([], tf.int64),
                    "store": tf.io.FixedLenFeature([], tf.int64),
                    "data": tf.io.FixedLenFeature([], tf.string)}

        def parse(serialized: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            record = tf.io.parse_single_example(serialized, features)
            check = tf.debugging.assert_equal(
                record["store"], tag, message=f"{where}: a record belongs to another store")
            with tf.control_dependencies([check]):
                return tf.identity(record["record"]), record["data"]

        def decode(piece: tf.Tensor, data: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            rows = tf.io.decode_raw(data, dtype, little_endian=True)
            return piece, tf.reshape(rows, [-1, *step_shape])

        ds = tf.data.Dataset.from_tensor_slices(paths)
        if shuffle:
            ds = ds.shuffle(len(paths), seed=seed, reshuffle_each_iteration=True)
        ds = ds.interleave(lambda path: tf.data.TFRecordDataset(path, compression),
                           cycle_length=RECORD_FILES_AT_ONCE,
                           num_parallel_calls=tf.data.AUTOTUNE, deterministic=not shuffle)
        ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE)
        ds = ds.filter(lambda piece, _: tf.gather(keep, piece))
        return ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=not shuffle)
