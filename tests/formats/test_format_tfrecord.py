"""TFRecord stores: the format contracts (tests/format_contract.py,
tests/hostile_contract.py), and what only TFRecord promises: plain-tf.data
interop, parts, halos, on-disk size, CRC-checked random access, and a gzip
record that inflates past its block refused."""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import ClassVar

import numpy as np
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

import windowkit as wk
from tests.conftest import collect_epoch, oracle_windows
from tests.format_contract import FormatTests
from tests.helpers import random_series
from tests.hostile_contract import (
    MUTATIONS,
    HostileStoreTests,
    assert_graph_path_agrees,
    convert_block_store,
    expect_errors,
    mutated,
)


def _read_without_windowkit(data_dir: Path, compression: str = "") -> list[dict]:
    """Read a store's records exactly as the README tells users to, with plain tf.data."""
    features = {
        "series": tf.io.FixedLenFeature([], tf.int64),
        "row": tf.io.FixedLenFeature([], tf.int64),
        "rows": tf.io.FixedLenFeature([], tf.int64),
        "halo": tf.io.FixedLenFeature([], tf.int64),
        "shape": tf.io.VarLenFeature(tf.int64),
        "data": tf.io.FixedLenFeature([], tf.string),
    }
    files = sorted(str(p) for p in data_dir.glob("part-*.tfrecord"))
    out = []
    for serialized in tf.data.TFRecordDataset(files, compression_type=compression):
        record = tf.io.parse_single_example(serialized, features)
        shape = tf.sparse.to_dense(record["shape"])
        values = tf.reshape(tf.io.decode_raw(record["data"], tf.float32),
                            tf.concat([[-1], shape], axis=0))
        out.append({key: int(record[key]) for key in ("series", "row", "rows", "halo")}
                   | {"values": values.numpy()})
    return out


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_plain_tf_data_reads_every_row_and_halo(tmp_path: Path, compression: str) -> None:
    series = random_series([300, 17, 450])
    spec = wk.WindowSpec(8, horizon=2)
    store = wk.convert(series, tmp_path / "s", format="tfrecord", window=spec, block_rows=64,
                       compression=compression, parts=3)
    records = _read_without_windowkit(store.path / "data",
                                      "GZIP" if compression == "gzip" else "")
    rebuilt: dict[int, list[np.ndarray]] = {0: [], 1: [], 2: []}
    for record in records:
        values, sid, row = record["values"], record["series"], record["row"]
        assert len(values) == record["rows"] + record["halo"]
        assert record["halo"] == min(spec.span - 1, len(series[sid]) - row - record["rows"])
        np.testing.assert_array_equal(values, series[sid][row:row + len(values)])
        rebuilt[sid].append(values[:record["rows"]])
    for sid, parts in rebuilt.items():
        np.testing.assert_array_equal(np.concatenate(parts), series[sid])


def test_parts_are_named_and_counted(tmp_path: Path) -> None:
    store = wk.convert(random_series([1000]), tmp_path / "s", format="tfrecord", window=4,
                       block_rows=32, parts=3)
    names = sorted(p.name for p in (store.path / "data").glob("*.tfrecord"))
    assert names == [f"part-0000{i}-of-00003.tfrecord" for i in range(3)]
    assert [s["records"] for s in store.info["data"]["shards"]] == [10, 11, 11]  # 32 blocks


def test_uncompressed_size_stays_within_five_percent_of_raw(tmp_path: Path) -> None:
    rows = np.random.default_rng(0).normal(size=(20_000, 16)).astype(np.float32)
    store = wk.convert([rows] * 3, tmp_path / "s", format="tfrecord", window=32)
    on_disk = sum(p.stat().st_size for p in (store.path / "data").glob("*.tfrecord"))
    assert on_disk <= 1.05 * rows.nbytes * 3


# the uniform reader reads a split that fits its budget when it is built (a
# windowkit error then); block groups read while iterating (a TensorFlow error)
READ_ERRORS = (tf.errors.OpError, wk.StoreError)


def test_random_access_detects_a_flipped_byte(tmp_path: Path) -> None:
    series = random_series([400])
    store = wk.convert(series, tmp_path / "s", format="tfrecord", window=8, block_rows=64)
    part = next((store.path / "data").glob("*.tfrecord"))
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0x01
    part.write_bytes(bytes(data))
    reopened = wk.open_store(store.path)
    with pytest.raises(wk.StoreError, match=rf"{part.name}: record \d+ at byte \d+: .*CRC"):
        reopened.windows("train", np.arange(reopened.num_windows("train")))
    with pytest.raises(READ_ERRORS, match=rf"{part.name}: record \d+ at byte \d+: .*CRC"):
        collect_epoch(reopened.tf_dataset("train", 16))


def test_random_access_detects_truncation(tmp_path: Path) -> None:
    store = wk.convert(random_series([400]), tmp_path / "s", format="tfrecord", window=8,
                       block_rows=64)
    part = next((store.path / "data").glob("*.tfrecord"))
    part.write_bytes(part.read_bytes()[:-10])
    with pytest.raises(wk.StoreError, match=rf"{part.name}: record 6 at byte \d+: "
                                            r"file is truncated"):
        wk.open_store(store.path).windows("train", [390])


def test_gzip_store_round_trips_through_both_readers(tmp_path: Path) -> None:
    series = random_series([333, 90])
    spec = wk.WindowSpec(5, stride=2, horizon=1)
    store = wk.convert(series, tmp_path / "s", format="tfrecord", window=spec,
                       compression="gzip", block_rows=40)
    expected_x, expected_y = oracle_windows(series, spec)
    x, y = store.windows("train", np.arange(len(expected_x)))
    np.testing.assert_array_equal(x, expected_x)
    np.testing.assert_array_equal(y, expected_y)
    got_x, got_y = collect_epoch(store.tf_dataset("train", 64, shuffle=False))
    np.testing.assert_array_equal(got_x, expected_x)
    np.testing.assert_array_equal(got_y, expected_y)


def test_tf_dataset_reads_only_the_records_holding_the_splits_windows(tmp_path: Path) -> None:
    """A split's epoch reads only the blocks holding its windows: a corrupt
    record of the training rows fails a training epoch, never a validation
    epoch, which does not read it."""
    series = random_series([600, 600])
    store = wk.convert(series, tmp_path / "s", format="tfrecord", window=8, block_rows=64,
                       splits={"train": 0.5, "val": 0.5})
    expected_val = store.windows("val", np.arange(store.num_windows("val")))
    records = pq.read_table(store.path / "data" / "records.parquet").to_pydict()
    first = 0  # series 0's first record: rows 0..63, training rows only
    assert records["series"][first] == 0 and records["row"][first] == 0
    part = store.path / records_path(store, records["shard"][first])
    data = bytearray(part.read_bytes())
    data[records["offset"][first] + records["bytes"][first] // 2] ^= 0x01
    part.write_bytes(bytes(data))
    reopened = wk.open_store(store.path)
    val_x, _ = collect_epoch(reopened.tf_dataset("val", 64, shuffle=False))
    np.testing.assert_array_equal(val_x, expected_val)
    with pytest.raises(READ_ERRORS, match=r"record 0 at byte 0: .*CRC"):
        collect_epoch(reopened.tf_dataset("train", 64))


def records_path(store: wk.Store, part: int) -> str:
    return store.manifest.data["shards"][part]["path"]


def test_tf_dataset_names_a_truncated_part_file(tmp_path: Path) -> None:
    store = wk.convert(random_series([400]), tmp_path / "s", format="tfrecord", window=8,
                       block_rows=64)
    part = next((store.path / "data").glob("*.tfrecord"))
    part.write_bytes(part.read_bytes()[:-10])
    with pytest.raises(READ_ERRORS, match=rf"{part.name}: record 6 at byte \d+: "
                                          r"file is truncated"):
        collect_epoch(wk.open_store(store.path).tf_dataset("train", 32))


def test_a_tfrecord_gzip_record_that_inflates_past_its_block_is_refused(
        tmp_path: Path) -> None:
    path = convert_block_store(tmp_path / "s", "tfrecord", compression="gzip").path
    records = pq.read_table(path / "data/records.parquet")
    part = sorted((path / "data").glob("part-*.tfrecord"))[0]
    size = int(records.column("bytes")[0].as_py())
    body = zlib.compressobj(9, zlib.DEFLATED, 31)  # ~1000 times its size inflated
    member = body.compress(bytes(size * 900)) + body.flush()
    assert len(member) <= size
    blob = bytearray(part.read_bytes())
    blob[:size] = member + bytes(size - len(member))  # trailing zeros: ignored by gzip
    part.write_bytes(bytes(blob))
    expect_errors(path, lambda _: None, "inflates past")


class TestTFRecord(FormatTests, HostileStoreTests):
    """The format contracts for TFRecord stores."""

    format_name = "tfrecord"
    reads_groups_in_graph = True
    #: test_a_hostile_store_read_by_tf_data reads each mutation on the graph path and
    #: checks it as the test below does, which also compares the NumPy path, for
    #: every mutation: its cases run in make test-slow only (conftest.py)
    FAST_IDS: ClassVar[dict[str, set[str]]] = {"test_a_hostile_store_read_by_tf_data": set()}

    @pytest.mark.parametrize("name", list(MUTATIONS))
    def test_the_graph_path_refuses_what_the_numpy_path_refuses(
            self, hostile_pristine: dict[str, tuple[Path, dict]], tmp_path: Path, name: str,
            fmt: str) -> None:
        """Every hostile store through ``tf_dataset``'s graph path and its NumPy
        path: the pristine windows from both, or the same line from both."""
        root, want = mutated(hostile_pristine, tmp_path, name, fmt)
        assert_graph_path_agrees(root, want)
