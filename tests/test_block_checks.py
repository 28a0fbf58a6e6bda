"""Readers check every block they read: each storage block's rows against the
digest written with the store, each data file's layout against the manifest,
decoding bounded by a block, no link followed. A changed store gives one
windowkit error through every reader, never different windows."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import zlib
from collections.abc import Callable
from pathlib import Path

import fsspec
import google_crc32c
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import windowkit as wk
from tests.conftest import collect_epoch, oracle_windows, window_keys
from windowkit.errors import WindowkitError, carried_error
from windowkit.formats.tfrecord_io import (
    decode_example,
    encode_example,
    frame_record,
    unframe_record,
)

SPEC = wk.WindowSpec(8, horizon=2)
BLOCK_ROWS = {"zarr": 64, "parquet": 64, "tfrecord": 200}


def _series(scale: float = 1.0) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    return [(rng.normal(size=(n, 3)) * scale).astype(np.float32) for n in (700, 333, 90)]


def _convert(out: Path, fmt: str, scale: float = 1.0, **options: object) -> wk.Store:
    return wk.convert(_series(scale), out, format=fmt, window=SPEC,
                      block_rows=BLOCK_ROWS[fmt], parts=4, **options)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A pristine store of each format, and one of other rows ("other")."""
    root = tmp_path_factory.mktemp("pristine")
    out = {}
    for fmt in BLOCK_ROWS:
        out[fmt] = _convert(root / fmt, fmt).path
        out[f"{fmt}-other"] = _convert(root / f"{fmt}-other", fmt, scale=2.0).path
    return out


@pytest.fixture
def store(tmp_path: Path, pristine: dict[str, Path], fmt: str) -> Path:
    """A fresh copy of the pristine store of ``fmt``."""
    shutil.copytree(pristine[fmt], tmp_path / "s")
    return tmp_path / "s"


# -- reading, and expecting one windowkit error --------------------------------------
def _windows(s: wk.Store) -> np.ndarray:
    return s.windows("train", np.arange(s.num_windows("train")))[0]


def _tf(s: wk.Store) -> np.ndarray:
    return collect_epoch(s.tf_dataset("train", 64, shuffle=False))[0]


def _keras(s: wk.Store) -> np.ndarray:
    ds = s.keras_dataset("train", 64, seed=1)
    return np.concatenate([ds[i][0] for i in range(len(ds))])


READERS: list[Callable[[wk.Store], np.ndarray]] = [_windows, _tf, _keras]


def _error_of(read: Callable[[], object]) -> WindowkitError:
    """The windowkit error ``read`` raises (directly, or carried by TensorFlow)."""
    try:
        read()
    except Exception as exc:
        found = carried_error(exc)
        assert found is not None, f"not a windowkit error: {exc!r}"[:2000]
        assert "\n" not in str(found).strip(), str(found)
        return found
    raise AssertionError("read the changed store without an error")


def _expect_errors(path: Path, change: Callable[[Path], None], match: str, *,
                   after_open: bool = False) -> None:
    """Each reader of the store at ``path`` (opened before or after ``change``)
    raises one windowkit error matching ``match``."""
    stores = [wk.open_store(path) for _ in READERS] if after_open else []
    change(path)
    for i, read in enumerate(READERS):
        error = _error_of(lambda i=i, read=read: read(stores[i] if after_open
                                                      else wk.open_store(path)))
        assert isinstance(error, wk.StoreError), repr(error)
        assert not isinstance(error, wk.StoreReplacedError), repr(error)
        assert match in str(error), (read.__name__, str(error))


def test_a_pristine_store_reads_the_oracle_windows(store: Path) -> None:
    expected, _ = oracle_windows(_series(), SPEC)
    s = wk.open_store(store)
    for read in READERS:
        got = read(s)
        if read is _keras:
            assert sorted(window_keys(got)) == sorted(window_keys(expected))
        else:
            np.testing.assert_array_equal(got, expected)


# -- changes to one block, checksums recomputed ----------------------------------------
def _rewrite_block(path: Path, fmt: str, block: int,
                   change: Callable[[np.ndarray], np.ndarray]) -> None:
    """Give ``block`` new rows, as a valid data file of the format (CRCs and
    page checksums recomputed)."""
    size = BLOCK_ROWS[fmt]
    if fmt == "zarr":
        import zarr

        array = zarr.open_array(str(path / "data"), mode="r+")
        array[block * size:(block + 1) * size] = change(array[block * size:(block + 1) * size])
    elif fmt == "parquet":
        manifest = json.loads((path / "windowkit.json").read_text())
        entry = manifest["data"]["files"][0]
        table = pq.read_table(path / entry["path"])
        lo, hi = block * size, min((block + 1) * size, len(table))
        values = np.column_stack([table.column(c).to_numpy() for c in ("f0", "f1", "f2")])
        values[lo:hi] = change(values[lo:hi])
        for i, name in enumerate(("f0", "f1", "f2")):
            table = table.set_column(2 + i, name, pa.array(values[:, i]))
        pq.write_table(table, path / entry["path"], row_group_size=size,
                       compression="zstd", write_page_checksum=True)
    else:
        records = pq.read_table(path / "data" / "records.parquet").to_pydict()
        first = records["global_row"].index(block * size)
        part = next(p for p in sorted((path / "data").glob("part-*.tfrecord"))
                     if int(p.name[5:10]) == records["shard"][first])
        blob = bytearray(part.read_bytes())
        at, length = records["offset"][first], records["bytes"][first]
        ints, data = decode_example(unframe_record(bytes(blob[at:at + length]), gzip=False))
        rows = np.frombuffer(data["data"], dtype="<f4").reshape(-1, 3).copy()
        rows[:records["rows"][first]] = change(rows[:records["rows"][first]])
        stored = frame_record(encode_example(ints, {"data": rows.tobytes()}), gzip=False)
        assert len(stored) == length
        blob[at:at + length] = stored
        part.write_bytes(bytes(blob))


@pytest.mark.parametrize("how", ["reversed", "one value"])
def test_a_rewritten_block_is_refused(store: Path, fmt: str, how: str) -> None:
    def change(rows: np.ndarray) -> np.ndarray:
        if how == "reversed":
            return rows[::-1].copy()
        rows = rows.copy()
        rows[50, 1] += 1.0  # past the halo the block before holds (TFRecord)
        return rows

    _expect_errors(store, lambda p: _rewrite_block(p, fmt, 1, change),
                   "do not match the digest")


def _swap(a: Path, b: Path) -> None:
    held = a.read_bytes()
    a.write_bytes(b.read_bytes())
    b.write_bytes(held)


def test_swapped_data_files_are_refused(store: Path, fmt: str) -> None:
    data = store / "data"
    if fmt == "zarr":
        pair, match = (data / "c/1/0", data / "c/2/0"), "do not match the digest"
    elif fmt == "parquet":  # two parts of equal rows
        files = json.loads((store / "windowkit.json").read_text())["data"]["files"]
        rows = [f["rows"] for f in files]
        i, j = next((i, j) for i in range(len(rows)) for j in range(i + 1, len(rows))
                    if rows[i] == rows[j])
        pair, match = (store / files[i]["path"], store / files[j]["path"]), "digest"
    else:
        parts = sorted(data.glob("part-*.tfrecord"))
        pair, match = (parts[0], parts[1]), ".tfrecord: record"
    _expect_errors(store, lambda _: _swap(*pair), match)


def test_a_block_of_another_store_is_refused(store: Path, fmt: str,
                                            pristine: dict[str, Path]) -> None:
    other = pristine[f"{fmt}-other"]
    name = {"zarr": "data/c/1/0", "parquet": "data/part-00001.parquet",
            "tfrecord": "data/part-00001-of-00004.tfrecord"}[fmt]
    match = {"zarr": "do not match the digest", "parquet": "belongs to store id",
             "tfrecord": "belongs to another store"}[fmt]
    _expect_errors(store, lambda p: shutil.copyfile(other / name, p / name), match)


# -- layout edits: dtype, byte order, column types -----------------------------------------
def _edit_json(path: Path, edit: Callable[[dict], None]) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def test_an_edited_dtype_is_refused(store: Path, fmt: str) -> None:
    def change(p: Path) -> None:
        _edit_json(p / "windowkit.json", lambda m: m.update(dtype="int32"))

    match = {"zarr": "differs from the manifest", "parquet": "differ from the manifest",
             "tfrecord": "do not match the digest"}[fmt]
    _expect_errors(store, change, match)


def test_an_edited_byte_order_or_column_type_is_refused(store: Path, fmt: str) -> None:
    def change(p: Path) -> None:
        if fmt == "zarr":
            _edit_json(p / "data/zarr.json", lambda m: m["codecs"][0]["configuration"].update(
                endian="big"))
        elif fmt == "parquet":
            part = p / "data/part-00000.parquet"
            table = pq.read_table(part)
            table = table.set_column(2, "f0", table.column("f0").cast(pa.float64()))
            pq.write_table(table, part, row_group_size=BLOCK_ROWS[fmt])
        else:  # the records say big-endian nowhere: a byte-swapped store reads other rows
            _rewrite_block(p, fmt, 0, lambda rows: rows.byteswap())

    match = {"zarr": "codecs", "parquet": "value columns",
             "tfrecord": "do not match the digest"}[fmt]
    _expect_errors(store, change, match)


# -- links ---------------------------------------------------------------------------------
def test_a_data_file_replaced_by_a_link_after_open_is_refused(store: Path, fmt: str,
                                                              tmp_path: Path) -> None:
    name = {"zarr": "data/c/1/0", "parquet": "data/part-00000.parquet",
            "tfrecord": "data/part-00000-of-00004.tfrecord"}

    def change(p: Path) -> None:
        target = tmp_path / "elsewhere"
        shutil.copyfile(p / name[fmt], target)  # the same bytes, but not the store's file
        (p / name[fmt]).unlink()
        (p / name[fmt]).symlink_to(target)

    _expect_errors(store, change, "is a link", after_open=True)


# -- decompression bombs -------------------------------------------------------------------
def _zstd_rle_bomb(size: int) -> bytes:
    """A zstd frame of ``size`` zero bytes made of RLE blocks (~4 bytes per 128 KiB)."""
    block = 128 << 10
    out = bytearray(b"\x28\xb5\x2f\xfd" + bytes([0xE0]) + struct.pack("<Q", size))
    left = size
    while left:
        n = min(block, left)
        left -= n
        out += struct.pack("<I", (n << 3) | (1 << 1) | (left == 0))[:3] + b"\0"
    return bytes(out)


def _gzip_bomb(size: int) -> bytes:
    deflate = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(1 << 20)
    return b"".join([deflate.compress(zeros) for _ in range(size >> 20)] + [deflate.flush()])


def _peak_growth_mb(path: Path) -> tuple[int, str]:
    """Peak RSS growth (MB) of a fresh process reading every window of ``path``."""
    code = (
        "import resource, sys, numpy as np, windowkit as wk\n"
        "s = wk.open_store(sys.argv[1]); n = s.num_windows('train')\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "try:\n    s.windows('train', np.arange(n)); print('no error')\n"
        "except wk.StoreError as exc:\n    print(exc)\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)\n")
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                          text=True, timeout=120, check=True)
    message, growth = done.stdout.strip().splitlines()[-2:]
    return int(growth), message


@pytest.mark.parametrize("compression", ["zstd", "gzip"])
def test_a_zarr_chunk_bomb_is_one_line_with_bounded_memory(tmp_path: Path,
                                                          compression: str) -> None:
    rows = np.random.default_rng(1).normal(size=(20000, 3)).astype(np.float32)
    path = wk.convert([rows], tmp_path / "s", format="zarr", window=SPEC, block_rows=8192,
                      compression=compression).path  # chunks of 96 KiB
    payload = _zstd_rle_bomb(1 << 30) if compression == "zstd" else _gzip_bomb(96 << 20)
    chunk = path / "data/c/1/0"
    chunk.write_bytes(payload + struct.pack("<I", google_crc32c.value(payload)))
    growth, message = _peak_growth_mb(path)
    assert "cannot decode Zarr chunk" in message and str(chunk) in message, message
    assert growth < 64, growth
    _expect_errors(path, lambda _: None, "cannot decode Zarr chunk")


def test_a_tfrecord_gzip_record_that_inflates_past_its_block_is_refused(
        tmp_path: Path) -> None:
    path = _convert(tmp_path / "s", "tfrecord", compression="gzip").path
    records = pq.read_table(path / "data/records.parquet")
    part = sorted((path / "data").glob("part-*.tfrecord"))[0]
    size = int(records.column("bytes")[0].as_py())
    body = zlib.compressobj(9, zlib.DEFLATED, 31)  # ~1000 times its size inflated
    member = body.compress(bytes(size * 900)) + body.flush()
    assert len(member) <= size
    blob = bytearray(part.read_bytes())
    blob[:size] = member + bytes(size - len(member))  # trailing zeros: ignored by gzip
    part.write_bytes(bytes(blob))
    _expect_errors(path, lambda _: None, "inflates past")


def test_a_parquet_row_group_larger_than_a_block_is_refused(
        tmp_path: Path, pristine: dict[str, Path]) -> None:
    store = tmp_path / "s"
    shutil.copytree(pristine["parquet"], store)
    part = store / "data/part-00000.parquet"

    def change(_: Path) -> None:
        table = pq.read_table(part)
        pq.write_table(table, part, row_group_size=len(table))

    _expect_errors(store, change, "not one storage block")


# -- a store replaced while it is read -----------------------------------------------------
def test_blocks_of_a_replacing_store_on_s3_are_never_mixed(fmt: str, s3_bucket: str,
                                                          pristine: dict[str, Path]) -> None:
    """A remote store whose data objects are being replaced: reading refuses the
    new blocks (no batch mixes two stores); once the manifest is replaced too,
    the error says "replaced"."""
    url = f"{s3_bucket}/s"
    fs = fsspec.filesystem("s3")
    fs.put(str(pristine[fmt]), url.removeprefix("s3://"), recursive=True)
    store = wk.open_store(url)
    expected, _ = oracle_windows(_series(), SPEC)
    np.testing.assert_array_equal(_windows(store), expected)
    other = pristine[f"{fmt}-other"]
    for path in sorted(p for p in other.rglob("*") if p.is_file()):
        relative = path.relative_to(other).as_posix()
        if relative.startswith(("data/c/1/", "data/part-00001")):  # a replacement under way
            fs.put(str(path), f"{url.removeprefix('s3://')}/{relative}")
    fresh = wk.open_store(url)
    for read in READERS:
        error = _error_of(lambda read=read: read(fresh))
        assert isinstance(error, wk.StoreError) and not isinstance(
            error, wk.StoreReplacedError), str(error)
    fs.put(str(other / "windowkit.json"), f"{url.removeprefix('s3://')}/windowkit.json")
    for read in READERS:
        error = _error_of(lambda read=read: read(fresh))
        assert isinstance(error, wk.StoreReplacedError), str(error)


def test_checks_can_be_switched_off_for_the_benchmark_only(store: Path, fmt: str) -> None:
    from windowkit.formats import _checks

    _rewrite_block(store, fmt, 1, lambda rows: rows[::-1].copy())
    s = wk.open_store(store)
    _checks._CHECKS = False
    try:
        _windows(s)  # reads the changed rows: nothing checks them
    finally:
        _checks._CHECKS = True
    assert "digest" in str(_error_of(lambda: _windows(wk.open_store(store))))
    assert os.path.exists(store / "data/_blocks.xxh3")


ENOSPC_SCRIPT = """
import asyncio, errno, sys, numpy as np
import zarr.storage
original = zarr.storage.LocalStore.set
async def failing_set(self, key, value):
    if key.startswith("c/3/"):
        raise OSError(errno.ENOSPC, "No space left on device")
    if key.startswith("c/"):
        await asyncio.sleep(0.3)  # other chunk writes are still pending then
    return await original(self, key, value)
zarr.storage.LocalStore.set = failing_set
import windowkit as wk
try:
    wk.convert([np.zeros((20000, 4), dtype="float32")], sys.argv[1], format="zarr",
               window=8, block_rows=256)
except wk.StoreError as exc:
    print(type(exc).__name__)
"""


def test_a_zarr_write_failing_for_lack_of_space_leaves_no_task_noise(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", ENOSPC_SCRIPT, str(tmp_path / "s")],
                          capture_output=True, text=True, timeout=120, check=True)
    assert "Error" in done.stdout
    assert "Task was destroyed" not in done.stderr, done.stderr[-2000:]
