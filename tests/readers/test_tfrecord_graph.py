"""A TFRecord store's ``tf_dataset`` read by TensorFlow's own ops (the default
path of a local, uncompressed store): no Python in its graph and a parallel
``interleave`` of ranged TFRecord reads; the very batches of the NumPy path
(``graph_reads=False``) and the oracle's windows in every shuffle mode,
sharded, normalized, as dict batches; a checkpoint resumed mid-epoch; a
damaged record refused, a rewritten block (valid CRCs) refused by its
digest, also hashed a block at a time; XXH3 (the block digests) computed in the graph as
``xxhash`` computes it."""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf
import xxhash

import windowkit as wk
import windowkit.readers.tf as tf_reader
import windowkit.readers.tfdata.digests as digests
from tests.conftest import oracle_windows, window_keys
from tests.helpers import graph_ops
from windowkit.errors import carried_error
from windowkit.formats.tfrecord_io import (
    decode_example,
    encode_example,
    frame_record,
    unframe_record,
)
from windowkit.readers.tfdata.xxh3 import length_class, xxh3_64
from windowkit.verify import verify_store

SPEC = wk.WindowSpec(6, stride=2, horizon=3)
KNOWN, TARGETS = [1], [2]
PYTHON_OPS = {"PyFunc", "PyFuncStateless", "EagerPyFunc"}


def _series() -> list[np.ndarray]:
    """Feature 0: the series; 1: the row (known ahead); 2, 3: values. Short
    series share blocks; one holds no window."""
    rng = np.random.default_rng(5)
    return [np.column_stack([np.full(n, s), np.arange(n), rng.normal(size=n),
                             rng.normal(size=n)]).astype(np.float32)
            for s, n in enumerate([300, 41, 222, 7, 160])]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> wk.Store:
    return wk.convert(_series(), tmp_path_factory.mktemp("graph") / "s", format="tfrecord",
                      window=SPEC, block_rows=48, parts=3, known_columns=["1"],
                      target_columns=["2"])


def _dataset(store: wk.Store, *, numpy_path: bool = False, **options: Any) -> tf.data.Dataset:
    """``store.tf_dataset("train", 32, ...)``, on the NumPy path if asked."""
    original = tf_reader.split_dataset
    if numpy_path:
        tf_reader.split_dataset = functools.partial(original, graph_reads=False)  # type: ignore[assignment]
    try:
        return store.tf_dataset("train", 32, **options)
    finally:
        tf_reader.split_dataset = original  # type: ignore[assignment]


def _epoch(ds: tf.data.Dataset) -> list[list[np.ndarray]]:
    return [[t.numpy() for t in tf.nest.flatten(batch)] for batch in ds]


def _assert_same(got: list[list[np.ndarray]], want: list[list[np.ndarray]]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)


def test_the_graph_holds_no_python_but_the_part_check_and_reads_in_parallel(
        store: wk.Store, tmp_path: Path) -> None:
    """Records are read and checked by TensorFlow's ops; Python runs once a
    group, to check that the parts it reads are regular files before
    TensorFlow opens them (a stat each: a FIFO swapped in is one line, never
    a hang)."""
    ops = graph_ops(_dataset(store, shuffle="blocks"))
    assert ops & PYTHON_OPS == {"PyFunc"}, ops & PYTHON_OPS
    assert {"ParallelInterleaveDatasetV4", "TFRecordDatasetV2", "ParseExampleV2"} <= ops
    gzip = wk.convert(_series()[:2], tmp_path / "gz", format="tfrecord", window=SPEC,
                      block_rows=48, compression="gzip")  # a part inflates from its start
    assert "PyFuncStateless" in graph_ops(gzip.tf_dataset("train", 32, shuffle="blocks"))


@pytest.mark.parametrize("options", [
    {"shuffle": True},  # uniform: rows held once, cut in the graph
    {"shuffle": "blocks", "shuffle_blocks": 2, "return_series": True, "normalize": True},
    {"shuffle": False, "num_shards": 2, "shard_index": 1},
], ids=["uniform", "blocks-series-normalized", "ordered-sharded"])
def test_batches_equal_the_numpy_paths_and_the_oracles(store: wk.Store,
                                                       options: dict[str, Any]) -> None:
    graph, numpy = _dataset(store, seed=4, **options), _dataset(store, numpy_path=True, seed=4,
                                                                **options)
    epochs = 2 if options["shuffle"] is True else 1
    got = [_epoch(graph) for _ in range(epochs)]  # each iteration: the next epoch
    for epoch in got:
        _assert_same(epoch, _epoch(numpy))
    if epochs == 2:
        assert not np.array_equal(got[0][0][0], got[1][0][0])
    if "normalize" in options:
        return
    x, y = oracle_windows(_series(), SPEC)  # every window, in index order
    known, inputs, targets = (np.concatenate([b[k] for b in got[0]]) for k in range(3))
    if options["shuffle"] is False:  # the shard's windows in index order: a run of the oracle's
        first = int(np.flatnonzero((x[:, 0, :2] == inputs[0, 0, :2]).all(1))[0])
        x, y = x[first:first + len(inputs)], y[first:first + len(inputs)]
    assert sorted(window_keys(inputs, np.concatenate([known, targets], 2))) == sorted(
        window_keys(x, np.concatenate([y[..., KNOWN], y[..., TARGETS]], 2)))


def test_a_checkpoint_resumes_mid_epoch(store: wk.Store, tmp_path: Path) -> None:
    whole = _epoch(_dataset(store, shuffle="blocks", shuffle_blocks=1, seed=2))  # its 1st epoch
    iterator = iter(_dataset(store, shuffle="blocks", shuffle_blocks=1, seed=2))
    checkpoint = tf.train.Checkpoint(iterator=iterator)
    for _ in range(5):
        next(iterator)
    path = checkpoint.write(str(tmp_path / "ckpt"))
    rest = [[t.numpy() for t in tf.nest.flatten(b)] for b in iterator]
    checkpoint.read(path).assert_consumed()
    again = [[t.numpy() for t in tf.nest.flatten(b)] for b in iterator]
    _assert_same(rest, whole[5:])
    _assert_same(again, whole[5:])


def test_a_damaged_record_is_an_error_not_other_windows(store: wk.Store,
                                                        tmp_path: Path) -> None:
    copy = Path(shutil.copytree(store.path, tmp_path / "s"))
    records = pq.read_table(copy / "data" / "records.parquet").to_pydict()
    part = copy / store.manifest.data["shards"][records["shard"][3]]["path"]
    blob = bytearray(part.read_bytes())
    blob[records["offset"][3] + records["bytes"][3] // 2] ^= 0x08  # in record 3's rows
    part.write_bytes(bytes(blob))
    with pytest.raises(tf.errors.OpError) as caught:
        _epoch(_dataset(wk.open_store(copy), shuffle=False))
    error = carried_error(caught.value)
    assert isinstance(error, wk.StoreError), caught.value
    assert str(error) == (f"{part}: record 3 at byte {records['offset'][3]}: record data fails "
                          "its CRC check")


@pytest.mark.parametrize("hashed_bytes", [digests.HASHED_BYTES, 1], ids=["group", "one-block"])
def test_a_rewritten_block_is_refused_by_its_digest(store: wk.Store, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    hashed_bytes: int) -> None:
    """A record of block 2 given other rows, its CRCs made right: only the
    digest tells. Hashed as one piece, and a block at a time (the pieces a
    large group is hashed in): the same batches, the same refusal."""
    monkeypatch.setattr(digests, "HASHED_BYTES", hashed_bytes)
    _assert_same(_epoch(_dataset(store, shuffle="blocks", seed=1)),
                 _epoch(_dataset(store, numpy_path=True, shuffle="blocks", seed=1)))
    copy = Path(shutil.copytree(store.path, tmp_path / "s"))
    records = pq.read_table(copy / "data" / "records.parquet").to_pydict()
    first = records["global_row"].index(2 * 48)
    part = copy / store.manifest.data["shards"][records["shard"][first]]["path"]
    blob = bytearray(part.read_bytes())
    at, length = records["offset"][first], records["bytes"][first]
    ints, data = decode_example(unframe_record(bytes(blob[at:at + length]), gzip=False))
    rows = np.frombuffer(data["data"], dtype="<f4").reshape(-1, 4)[::-1].copy()
    blob[at:at + length] = frame_record(encode_example(ints, {"data": rows.tobytes()}),
                                        gzip=False)
    part.write_bytes(bytes(blob))
    with pytest.raises(tf.errors.OpError) as caught:
        _epoch(_dataset(wk.open_store(copy), shuffle="blocks"))
    error = carried_error(caught.value)
    assert isinstance(error, wk.StoreError), caught.value
    assert "block 2 (rows 96..144): its decoded rows do not match the digest" in str(error)


def test_xxh3_in_the_graph_is_xxhashs() -> None:
    """Every length class of XXH3 (0-3, 4-8, 9-16, 17-128, 129-240, longer; one
    or more KiB blocks of stripes), at its edges, with zero and random seeds;
    the length a constant, and a tensor (one traced function per class)."""
    rng = np.random.default_rng(0)
    traced = {kind: tf.function(lambda u, n, s, kind=kind: xxh3_64(u, n, s, kind))
              for kind in ("short", "mid", "long")}
    for length in (0, 1, 3, 4, 8, 9, 16, 17, 32, 33, 64, 65, 96, 97, 128, 129, 143, 240, 241,
                   1023, 1024, 1025, 2113, 4100):
        units = tf.constant([rng.integers(0, 256, length, dtype=np.uint8).tobytes()
                             for _ in range(3)])
        seeds = np.array([0, *rng.integers(0, 2**64, 2, dtype=np.uint64)], dtype=np.uint64)
        want = [xxhash.xxh3_64_intdigest(u, int(s))
                for u, s in zip(units.numpy(), seeds, strict=True)]
        assert xxh3_64(units, length, tf.constant(seeds)).numpy().tolist() == want, length
        dynamic = traced[length_class(length)](units, tf.constant(length, tf.int64),
                                               tf.constant(seeds))
        assert dynamic.numpy().tolist() == want, length


def test_a_store_whose_first_record_never_comes_is_one_error(tmp_path: Path) -> None:
    """The first record's length field flipped in a one-part store: refused
    before TensorFlow's reader reads it, in the Python reader's words."""
    store = wk.convert([np.arange(600, dtype=np.float32).reshape(300, 2)], tmp_path / "s",
                       format="tfrecord", window=8)
    part = sorted((tmp_path / "s" / "data").glob("*.tfrecord"))
    assert len(part) == 1
    blob = bytearray(part[0].read_bytes())
    blob[2] ^= 0xFF  # the first record's length: its reader would stop before any record
    part[0].write_bytes(bytes(blob))
    assert _error_line(store) == _error_line(store, numpy_path=True) == (
        f"{part[0]}: record 0 at byte 0: record length fails its CRC check")


# -- damage the records' CRCs cannot see: both paths refuse it, in the same words --------------
HALO_SPEC = wk.WindowSpec(8, horizon=2)


@pytest.fixture(scope="module")
def halo_store(tmp_path_factory: pytest.TempPathFactory) -> wk.Store:
    """Series of 36 and 60 rows in blocks of 32: record 0 ends with a 4-row halo
    cut short by the end of series 0 (rows 32..35, the head of block 1)."""
    rng = np.random.default_rng(3)
    arrays = [rng.normal(size=(n, 3)).astype(np.float32) for n in (36, 60)]
    return wk.convert(arrays, tmp_path_factory.mktemp("halo") / "s", format="tfrecord",
                      window=HALO_SPEC, block_rows=32, parts=1)


def _error_line(store: wk.Store, *, numpy_path: bool = False, **options: Any) -> str:
    """The one line ``tf_dataset`` gives for ``store`` (built and read an epoch)."""
    try:
        _epoch(_dataset(wk.open_store(store.path), numpy_path=numpy_path, **options))
    except Exception as exc:
        error = carried_error(exc)
        assert isinstance(error, wk.StoreError), repr(exc)[:2000]
        assert "\n" not in str(error)
        return str(error)
    raise AssertionError("read the damaged store without an error")


def _edit_record(path: Path, record: int, edit: Any) -> None:
    """Record ``record`` of a store given other rows (``edit(rows)``), its CRCs
    made right and the manifest's checksums recomputed."""
    from tests.hostile_contract import _rehash

    table = pq.read_table(path / "data" / "records.parquet").to_pydict()
    store = wk.open_store(path)
    part = path / store.manifest.data["shards"][table["shard"][record]]["path"]
    blob = bytearray(part.read_bytes())
    at, length = table["offset"][record], table["bytes"][record]
    ints, data = decode_example(unframe_record(bytes(blob[at:at + length]), gzip=False))
    rows = np.frombuffer(data["data"], dtype="<f4").reshape(-1, *store.layout.step_shape).copy()
    edit(rows)
    blob[at:at + length] = frame_record(encode_example(ints, {"data": rows.tobytes()}),
                                        gzip=False)
    part.write_bytes(bytes(blob))
    _rehash(path)


@pytest.mark.parametrize("shuffle", [False, True, "blocks"])
def test_a_halo_cut_short_and_rewritten_is_refused(halo_store: wk.Store, tmp_path: Path,
                                                   shuffle: Any) -> None:
    """Record 0's 4 halo rows rewritten, its CRCs and the manifest made right:
    the graph path reads block 1 too and compares; the same line as the NumPy
    path, and ``verify`` names it."""
    copy = wk.open_store(shutil.copytree(halo_store.path, tmp_path / "s"))
    _edit_record(copy.path, 0, lambda rows: rows.__setitem__(slice(32, None), -7))
    line = _error_line(copy, shuffle=shuffle, seed=1)
    assert line == _error_line(copy, numpy_path=True, shuffle=shuffle, seed=1)
    assert "block 1 (rows 32.." in line and "do not match the digest" in line
    assert any("block 1" in problem for problem in verify_store(copy.path))


@pytest.mark.parametrize("shuffle", [False, "blocks"])
def test_halos_cut_short_in_a_row_read_as_the_numpy_path_reads(tmp_path: Path,
                                                               shuffle: Any) -> None:
    """Blocks 1 and 2 both end in a halo cut short (series of 39 and 16 rows,
    then one of 1, in blocks of 16; a window spans 16 rows): a group of block 1
    reads block 2 to check its halo, and block 2's own halo is not its to
    check. One block a group, the same batches as the NumPy path and the oracle."""
    spec = wk.WindowSpec(3, sampling_rate=3, horizon=3)
    series = [np.arange(n, dtype=np.float32) + 100 * s for s, n in enumerate([39, 16, 1])]
    store = wk.convert(series, tmp_path / "s", format="tfrecord", window=spec, block_rows=16)
    graph = _epoch(_dataset(store, shuffle=shuffle, seed=3, cache_bytes=1))
    _assert_same(graph, _epoch(_dataset(store, numpy_path=True, shuffle=shuffle, seed=3,
                                        cache_bytes=1)))
    expected_x, _ = oracle_windows(series, spec)
    got = np.concatenate([batch[0] for batch in graph])
    assert sorted(map(bytes, got)) == sorted(map(bytes, expected_x))


def test_a_whole_halo_rewritten_is_found_by_verify(store: wk.Store, tmp_path: Path) -> None:
    copy = Path(shutil.copytree(store.path, tmp_path / "s"))
    table = pq.read_table(copy / "data" / "records.parquet").to_pydict()
    record = next(i for i, h in enumerate(table["halo"]) if h == SPEC.span - 1)
    assert verify_store(copy) == []
    _edit_record(copy, record, lambda rows: rows.__setitem__(slice(-1, None), 9.0))
    problems = verify_store(copy)
    assert len(problems) == 1 and "do not match the digest" in problems[0], problems


@pytest.fixture(scope="module")
def even_store(tmp_path_factory: pytest.TempPathFactory) -> wk.Store:
    """One series in blocks of 48 rows: records of equal sizes, in one part."""
    rows = np.random.default_rng(9).normal(size=(480, 3)).astype(np.float32)
    return wk.convert([rows], tmp_path_factory.mktemp("even") / "s", format="tfrecord",
                      window=HALO_SPEC, block_rows=48, parts=1)


def _records_moved(path: Path, order: list[int], *, offsets: bool) -> None:
    """The records of a one-part store laid out in ``order``; the records table
    told their new offsets where ``offsets`` (checksums recomputed either way)."""
    from tests.hostile_contract import _rehash

    table = pq.read_table(path / "data" / "records.parquet")
    columns = table.to_pydict()
    part = sorted((path / "data").glob("*.tfrecord"))[0]
    blob = part.read_bytes()
    pieces = [blob[a:a + n] for a, n in zip(columns["offset"], columns["bytes"], strict=True)]
    moved, at = [], 0
    new_offsets = list(columns["offset"])
    for record in order:
        moved.append(pieces[record])
        new_offsets[record] = at
        at += len(pieces[record])
    part.write_bytes(b"".join(moved))
    if offsets:
        index = table.schema.get_field_index("offset")
        table = table.set_column(index, "offset", pa.array(new_offsets, pa.int64()))
        pq.write_table(table, path / "data" / "records.parquet")
    _rehash(path)


def test_two_records_swapped_are_named_as_the_numpy_path_names_them(even_store: wk.Store,
                                                                   tmp_path: Path) -> None:
    copy = wk.open_store(shutil.copytree(even_store.path, tmp_path / "s"))
    count = len(pq.read_table(copy.path / "data" / "records.parquet"))
    _records_moved(copy.path, [1, 0, *range(2, count)], offsets=False)
    line = _error_line(copy, shuffle=False)
    assert line == _error_line(copy, numpy_path=True, shuffle=False)
    assert "record 0 at byte 0: field 'record' is [1], the records table says [0]" in line


def test_records_reordered_with_their_offsets_read_the_same_windows(even_store: wk.Store,
                                                                    tmp_path: Path) -> None:
    copy = wk.open_store(shutil.copytree(even_store.path, tmp_path / "s"))
    count = len(pq.read_table(copy.path / "data" / "records.parquet"))
    _records_moved(copy.path, list(range(count))[::-1], offsets=True)
    _assert_same(_epoch(_dataset(copy, shuffle=False)), _epoch(_dataset(even_store,
                                                                        shuffle=False)))


@pytest.mark.parametrize("claim", [768 << 20, 20 << 30])
def test_a_header_claiming_more_than_its_record_is_refused_before_any_read(
        even_store: wk.Store, tmp_path: Path, claim: int) -> None:
    """A record's length field rewritten (its CRC made right) to claim 768 MiB
    or 20 GiB: refused when the dataset is built, from the records table, so
    TensorFlow's reader (which allocates what a header claims) never reads it."""
    from windowkit.formats.tfrecord_io import masked_crc32c

    copy = wk.open_store(shutil.copytree(even_store.path, tmp_path / "s"))
    part = sorted((copy.path / "data").glob("*.tfrecord"))[0]
    at = pq.read_table(copy.path / "data" / "records.parquet").column("offset")[2].as_py()
    blob = bytearray(part.read_bytes())
    length = claim.to_bytes(8, "little")
    blob[at:at + 12] = length + masked_crc32c(length).to_bytes(4, "little")
    part.write_bytes(bytes(blob))
    with pytest.raises(wk.StoreError) as caught:  # raised building, not reading
        copy.tf_dataset("train", 32, shuffle=False)
    assert str(caught.value) == _error_line(copy, numpy_path=True, shuffle=False)
    assert f"record 2 at byte {at}: record holds" in str(caught.value)


@pytest.mark.parametrize("damage", ["truncated", "a directory"])
def test_a_part_cut_short_or_replaced_is_one_line(even_store: wk.Store, tmp_path: Path,
                                                  damage: str) -> None:
    copy = wk.open_store(shutil.copytree(even_store.path, tmp_path / "s"))
    part = sorted((copy.path / "data").glob("*.tfrecord"))[0]
    if damage == "truncated":
        blob = part.read_bytes()
        part.write_bytes(blob[:len(blob) // 2])
        line = _error_line(copy, shuffle=False)
        assert line == _error_line(copy, numpy_path=True, shuffle=False)
        assert "file is truncated (" in line
    else:
        part.unlink()
        part.mkdir()
        assert str(part) in _error_line(copy, shuffle=False)


def test_a_refused_record_is_named_without_reading_its_whole_part(even_store: wk.Store,
                                                                  tmp_path: Path) -> None:
    """A part followed by a 40 GiB sparse tail, one record's data flipped after
    the dataset was built: the line says which record, found by a few one-byte
    reads, never a read of the whole part (which ran out of memory before)."""
    copy = wk.open_store(shutil.copytree(even_store.path, tmp_path / "s"))
    table = pq.read_table(copy.path / "data" / "records.parquet").to_pydict()
    part = sorted((copy.path / "data").glob("*.tfrecord"))[0]
    os.truncate(part, part.stat().st_size + (40 << 30))
    dataset = _dataset(copy, shuffle=False)
    at = table["offset"][3] + table["bytes"][3] // 2
    with open(part, "r+b") as file:
        file.seek(at)
        byte = file.read(1)
        file.seek(at)
        file.write(bytes([byte[0] ^ 0x08]))
    with pytest.raises(tf.errors.OpError) as caught:
        _epoch(dataset)
    assert str(carried_error(caught.value)) == (
        f"{part}: record 3 at byte {table['offset'][3]}: record data fails its CRC check")


def test_a_gzip_store_relabelled_uncompressed_is_one_line(tmp_path: Path) -> None:
    import json

    store = wk.convert([np.arange(6000, dtype=np.float32).reshape(3000, 2)], tmp_path / "s",
                       format="tfrecord", window=8, compression="gzip")
    manifest = json.loads((store.path / "windowkit.json").read_text())
    manifest["data"]["compression"] = "none"
    (store.path / "windowkit.json").write_text(json.dumps(manifest))
    relabelled = wk.open_store(store.path)
    line = _error_line(relabelled, shuffle=False)
    assert line == _error_line(relabelled, numpy_path=True, shuffle=False)
    assert "record 0 at byte 0: record length fails its CRC check" in line
