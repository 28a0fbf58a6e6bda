"""The hostile-store contract: what every format does with a store it did not
write as it is. ``HostileStoreTests`` holds the tests of a store changed after
conversion, run for every format (each tests/formats/test_format_<name>.py subclass
inherits it beside ``FormatTests``); a new format passes them by subclassing
(and adding its entries to the per-format tables here: ``BLOCK_ROWS``,
``_rewrite_block`` and the file names the block checks change).

Block checks: readers check every block they read: each storage block's rows
against the digest written with the store, each data file's layout against the
manifest, no link followed. A changed store gives one windowkit error through
every reader, never different windows.

Hostile stores: a list of mutations of a small store, each run through
``open_store``, ``Store.windows`` (plain and normalized), ``keras_dataset``,
``torch_dataset``, ``grain_source``, ``tf_dataset`` (one epoch each; for
TFRecord on its graph path and its NumPy path, which must say the same) and
``verify``. Every reader must give one
windowkit error (one line; through TensorFlow, the error it carries) or exactly
the pristine windows, and ``verify`` must name a problem: a store is untrusted
input. Mutations edit the manifest, the index and series tables, and the data
files (swaps, bit flips, truncations, links), many of them with the manifest's
sizes and SHA-256 recomputed, as someone forging a store would.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import fsspec
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
from windowkit.manifest import file_digest
from windowkit.verify import verify_store

# == block checks: helpers ==================================================================
BLOCK_SPEC = wk.WindowSpec(8, horizon=2)
BLOCK_ROWS = {"zarr": 64, "parquet": 64, "tfrecord": 200}


def _block_series(scale: float = 1.0) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    return [(rng.normal(size=(n, 3)) * scale).astype(np.float32) for n in (700, 333, 90)]


def convert_block_store(out: Path, fmt: str, scale: float = 1.0, **options: object) -> wk.Store:
    """A store of three series (values times ``scale``) in 4 parts, of the format's block size."""
    return wk.convert(_block_series(scale), out, format=fmt, window=BLOCK_SPEC,
                      block_rows=BLOCK_ROWS[fmt], parts=4, **options)


# -- reading, and expecting one windowkit error --------------------------------------
def _read_windows(s: wk.Store) -> np.ndarray:
    return s.windows("train", np.arange(s.num_windows("train")))[0]


def _read_tf(s: wk.Store) -> np.ndarray:
    return collect_epoch(s.tf_dataset("train", 64, shuffle=False))[0]


def _read_keras(s: wk.Store) -> np.ndarray:
    ds = s.keras_dataset("train", 64, seed=1)
    return np.concatenate([ds[i][0] for i in range(len(ds))])


READERS: list[Callable[[wk.Store], np.ndarray]] = [_read_windows, _read_tf, _read_keras]


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


def expect_errors(path: Path, change: Callable[[Path], None], match: str, *,
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


def _swap_files(a: Path, b: Path) -> None:
    held = a.read_bytes()
    a.write_bytes(b.read_bytes())
    b.write_bytes(held)


# -- layout edits: dtype, byte order, column types -----------------------------------------
def _edit_json(path: Path, edit: Callable[[dict], None]) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


# == hostile stores: helpers ================================================================
HOSTILE_SPEC = wk.WindowSpec(8, stride=2, horizon=2)
LENGTHS = (300, 170, 40)
Mutation = Callable[[Path, str], None]


def _windows(path: Path) -> dict[str, Any]:
    store = wk.open_store(path)
    return {split: store.windows(split, np.arange(store.num_windows(split)))
            for split in store.splits}


def _index(path: Path) -> dict[str, np.ndarray]:
    store = wk.open_store(path)
    return {split: store.index(split) for split in store.splits}


def _normalized(path: Path) -> Any:
    store = wk.open_store(path)
    return store.windows("train", np.arange(store.num_windows("train")), normalize=True)


def _keras(path: Path) -> Any:
    dataset = wk.open_store(path).keras_dataset("train", 16, shuffle=False)
    batches = [dataset[i] for i in range(len(dataset))]
    return tuple(np.concatenate([np.asarray(b[k]) for b in batches]) for k in range(2))


def _torch(path: Path) -> Any:
    dataset = wk.open_store(path).torch_dataset("train", 16, shuffle=False)
    batches = [dataset[i] for i in range(len(dataset))]
    return tuple(np.concatenate([b[k].numpy() for b in batches]) for k in range(2))


def _grain(path: Path) -> Any:
    source = wk.open_store(path).grain_source("train")
    items = source._getitems(list(range(len(source))))
    return tuple(np.stack([item[k] for item in items]) for k in range(2))


def _tf(path: Path) -> Any:
    return collect_epoch(wk.open_store(path).tf_dataset("train", 16, shuffle=False))


def _tf_numpy_path(path: Path) -> Any:
    """:func:`_tf` with its groups read by the format's Python row reader."""
    import windowkit.readers.tf as tf_reader

    original = tf_reader.split_dataset
    tf_reader.split_dataset = functools.partial(original, graph_reads=False)  # type: ignore[assignment]
    try:
        return _tf(path)
    finally:
        tf_reader.split_dataset = original  # type: ignore[assignment]


def assert_graph_path_agrees(root: Path, want: dict[str, Any]) -> None:
    """``tf_dataset`` on the graph path and on the NumPy path (the format's
    Python row reader): the same pristine windows, or the same one line."""
    graph, numpy = _attempt(_tf, root), _attempt(_tf_numpy_path, root)
    assert graph[0] == numpy[0], (graph, numpy)
    if graph[0] == "ok":
        assert _same(graph[1], want["tf"][1]), "other windows than the store's"
    else:
        assert type(graph[1]) is type(numpy[1]) and str(graph[1]) == str(numpy[1]), (
            str(graph[1]), str(numpy[1]))


def _all_readers(path: Path, *, tf: bool) -> dict[str, Any]:
    readers: dict[str, Callable[[Path], Any]] = {
        "open": lambda p: wk.open_store(p).splits, "index": _index, "windows": _windows,
        "normalized": _normalized, "keras": _keras, "torch": _torch, "grain": _grain}
    if tf:
        readers["tf"] = _tf
    return {name: _attempt(read, path) for name, read in readers.items()}


def _attempt(read: Callable[[Path], Any], path: Path) -> tuple[str, Any]:
    """``("ok", what it read)`` or ``("error", the windowkit error)``; anything
    else (a traceback, a foreign error) fails the test."""
    try:
        return "ok", read(path)
    except Exception as exc:  # sorted out right here
        carried = carried_error(exc)
        assert carried is not None, f"not a windowkit error: {type(exc).__name__}: {exc}"
        assert "\n" not in str(carried), str(carried)
        return "error", carried


def _same(got: Any, want: Any) -> bool:
    if isinstance(want, dict):
        return isinstance(got, dict) and set(got) == set(want) and all(
            _same(got[k], want[k]) for k in want)
    if isinstance(want, tuple | list):
        return isinstance(got, tuple | list) and len(got) == len(want) and all(
            _same(g, w) for g, w in zip(got, want, strict=True))
    if isinstance(want, np.ndarray):
        got = np.asarray(got)
        return got.dtype == want.dtype and got.shape == want.shape and bool(
            np.array_equal(got, want))
    return bool(got == want)


# -- mutation helpers ----------------------------------------------------------------------
def _read_manifest(root: Path) -> dict[str, Any]:
    return json.loads((root / "windowkit.json").read_text())


def _write_manifest(root: Path, manifest: dict[str, Any]) -> None:
    (root / "windowkit.json").write_text(json.dumps(manifest))


def _rehash(root: Path) -> None:
    """Record every listed file's present size and SHA-256 in the manifest (a forger's
    last step): only the content can tell then."""
    manifest = _read_manifest(root)
    for entry in manifest["files"]:
        path = root / entry["path"]
        if path.is_file() and not path.is_symlink():
            entry["bytes"], entry["sha256"] = path.stat().st_size, file_digest(path)
    _write_manifest(root, manifest)


def manifest_edit(edit: Callable[[dict[str, Any]], None]) -> Mutation:
    def mutate(root: Path, fmt: str) -> None:
        manifest = _read_manifest(root)
        edit(manifest)
        _write_manifest(root, manifest)
    return mutate


def table_edit(relative: str, edit: Callable[[pa.Table], pa.Table]) -> Mutation:
    """Rewrite a Parquet table of the store, then the manifest's sizes and checksums."""
    def mutate(root: Path, fmt: str) -> None:
        path = root / relative
        pq.write_table(edit(pq.read_table(path)), path)
        _rehash(root)
    return mutate


def _set(table: pa.Table, name: str, values: Any, kind: Any = None) -> pa.Table:
    where = table.column_names.index(name)
    kind = kind or table.schema.field(name).type
    return table.set_column(where, name, pa.array(values, type=kind))


def _changed(table: pa.Table, name: str, change: Callable[[np.ndarray], None]) -> pa.Table:
    values = table.column(name).to_numpy().copy()
    change(values)
    return _set(table, name, values)


def _data_files(root: Path) -> list[str]:
    """The store's data files holding rows: Parquet and TFRecord parts, Zarr chunks
    (not the formats' metadata, nor the block digests)."""
    return sorted(path for path in (e["path"] for e in _read_manifest(root)["files"])
                  if path.startswith(("data/part-", "data/c/")))


def data_edit(edit: Callable[[Path, list[str]], None], *, rehash: bool) -> Mutation:
    def mutate(root: Path, fmt: str) -> None:
        edit(root, _data_files(root))
        if rehash:
            _rehash(root)
    return mutate


def _swap(root: Path, files: list[str]) -> None:
    a, b = root / files[0], root / files[1]
    data = a.read_bytes()
    a.write_bytes(b.read_bytes())
    b.write_bytes(data)


def _flip(root: Path, files: list[str]) -> None:
    path = root / files[0]
    data = bytearray(path.read_bytes())
    for where in range(len(data) // 4, 3 * len(data) // 4, 97):
        data[where] ^= 0x10  # some land where no reader looks (Parquet statistics, say)
    path.write_bytes(bytes(data))


def _truncate(root: Path, files: list[str]) -> None:
    path = root / files[0]
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _link(root: Path, files: list[str]) -> None:
    """A data file replaced by a link (followed, as a DVC checkout's are) to
    a copy with other bytes: the link brings in nothing the checks pass."""
    path = root / files[0]
    copy = root.parent / f"{root.name}-copy-{path.name}"
    shutil.copyfile(path, copy)
    path.unlink()
    path.symlink_to(copy)
    _flip(root, files)


def _nested(root: Path, fmt: str) -> None:
    (root / "windowkit.json").write_text("[" * 100_000 + "]" * 100_000)


def _index_into_val(root: Path, fmt: str) -> None:
    """The last training window of series 0 moved into the validation rows."""
    series = pq.read_table(root / "series.parquet")
    val_first = int(series.column("split_val_first_row")[0].as_py())

    def edit(table: pa.Table) -> pa.Table:
        last = int(np.flatnonzero(table.column("series").to_numpy() == 0)[-1])
        return _changed(table, "start", lambda s: s.__setitem__(last, val_first))
    table_edit("index/train.parquet", edit)(root, fmt)


def _series_swapped(table: pa.Table) -> pa.Table:
    """Series 0 and 1 trade their rows (offsets recomputed, split ranges swapped)."""
    order = [1, 0, 2]
    for name in table.column_names:
        if name == "rows" or name.startswith("split_"):
            table = _set(table, name, table.column(name).to_numpy()[order])
    rows = table.column("rows").to_numpy()
    return _set(table, "row_offset", np.cumsum(rows) - rows)


def _index_strings(table: pa.Table) -> pa.Table:
    return _set(table, "series", [str(v) for v in table.column("series").to_pylist()],
                pa.string())


def _swap_rows(values: np.ndarray) -> None:
    values[[0, 1]] = values[[1, 0]]


def _float64(manifest: dict[str, Any]) -> None:
    manifest.update(dtype="float64")
    manifest["data"]["raw_bytes"] *= 2


def _series_is_an_index(root: Path, fmt: str) -> None:
    shutil.copyfile(root / "index/train.parquet", root / "series.parquet")
    _rehash(root)


def _stats(key: str, value: float) -> Mutation:
    return manifest_edit(lambda m: m["normalization"].__setitem__(
        key, [value] * len(m["normalization"][key])))


MUTATIONS: dict[str, Mutation] = {
    # the manifest (it lists no checksum of its own)
    "dtype int32": manifest_edit(lambda m: m.update(dtype="int32")),
    "dtype float64": manifest_edit(_float64),
    "step_shape [3, 1]": manifest_edit(lambda m: m.update(step_shape=[3, 1])),
    "block_rows doubled": manifest_edit(lambda m: m.update(block_rows=m["block_rows"] * 2)),
    "block_rows halved": manifest_edit(lambda m: m.update(block_rows=m["block_rows"] // 2)),
    "normalization mean 1e308": _stats("mean", 1e308),
    "normalization std 1e-308": _stats("std", 1e-308),
    "normalization std negative": _stats("std", -1.0),
    "normalization count 0": manifest_edit(lambda m: m["normalization"].update(count=0)),
    "split count +1": manifest_edit(lambda m: m["splits"]["train"].update(
        windows=m["splits"]["train"]["windows"] + 1)),
    "split count -1": manifest_edit(lambda m: m["splits"]["val"].update(
        windows=m["splits"]["val"]["windows"] - 1)),
    "manifest nested 100k deep": _nested,
    "index is series.parquet": manifest_edit(lambda m: m["splits"]["train"].update(
        index="series.parquet")),
    "index is a data file": manifest_edit(lambda m: m["splits"]["train"].update(index=sorted(
        e["path"] for e in m["files"] if e["path"].startswith("data/"))[0])),
    # the index tables, checksums recomputed
    "index start in val rows": _index_into_val,
    "index length changed": table_edit("index/train.parquet", lambda t: _changed(
        t, "length", lambda v: v.__setitem__(3, 9))),
    "index series out of range": table_edit("index/val.parquet", lambda t: _changed(
        t, "series", lambda v: v.__setitem__(-1, 7))),
    "index rows swapped": table_edit("index/train.parquet", lambda t: _changed(
        t, "start", _swap_rows)),
    "index row repeated": table_edit("index/train.parquet", lambda t: _changed(
        t, "start", lambda v: v.__setitem__(1, v[0]))),
    "index start off the grid": table_edit("index/train.parquet", lambda t: _changed(
        t, "start", lambda v: v.__setitem__(1, v[1] + 1))),
    "index with a missing start": table_edit("index/val.parquet", lambda t: _set(
        t, "start", [None, *t.column("start").to_pylist()[1:]])),
    "index without start": table_edit("index/train.parquet", lambda t: t.rename_columns(
        ["series", "begin", "length"])),
    "index series as strings": table_edit("index/train.parquet", _index_strings),
    # the series table, checksums recomputed
    "series rows swapped": table_edit("series.parquet", _series_swapped),
    "series rows as int32": table_edit("series.parquet", lambda t: _set(
        t, "rows", t.column("rows").to_numpy(), pa.int32())),
    "series with a missing split row": table_edit("series.parquet", lambda t: _set(
        t, "split_val_first_row", [None, *t.column("split_val_first_row").to_pylist()[1:]])),
    "series without row_offset": table_edit("series.parquet", lambda t: t.drop_columns(
        ["row_offset"])),
    "series split range cut": table_edit("series.parquet", lambda t: _changed(
        t, "split_train_end_row", lambda v: v.__setitem__(0, v[0] - 20))),
    "series is an index table": _series_is_an_index,
    # the data files
    "data files swapped": data_edit(_swap, rehash=False),
    "data files swapped, checksums recomputed": data_edit(_swap, rehash=True),
    "bit flip": data_edit(_flip, rehash=False),
    "bit flip, checksums recomputed": data_edit(_flip, rehash=True),
    "truncated": data_edit(_truncate, rehash=False),
    "truncated, sizes recomputed": data_edit(_truncate, rehash=True),
    "data file a link to other bytes": data_edit(_link, rehash=False),
    "data file missing": data_edit(lambda root, files: (root / files[0]).unlink(),
                                   rehash=False),
}

#: A representative few whose ``tf_dataset`` epoch runs in the fast suite (all: slow).
TF_FAST = {"normalization mean 1e308", "index start in val rows", "index length changed",
           "series rows swapped", "bit flip", "data files swapped, checksums recomputed"}


def _cases(tf: bool) -> list[Any]:
    out = []
    for name in MUTATIONS:
        marks: list[Any] = []
        if tf and name not in TF_FAST:
            marks.append(pytest.mark.slow)
        out.append(pytest.param(name, marks=marks, id=name))
    return out


def mutated(pristine: dict[str, tuple[Path, dict]], tmp_path: Path, name: str,
            fmt: str) -> tuple[Path, dict]:
    """A copy of the pristine store of ``fmt`` in ``tmp_path`` with mutation ``name``
    done, and the pristine store's windows."""
    source, readers = pristine[fmt]
    root = tmp_path / "store"
    shutil.copytree(source, root, symlinks=True)
    MUTATIONS[name](root, fmt)
    return root, readers


def _check(root: Path, want: dict[str, Any], got: dict[str, Any]) -> None:
    for reader, (kind, value) in got.items():
        if kind == "ok":
            assert _same(value, want[reader][1]), f"{reader}: other windows than the store's"


#: What only decoding finds (a forger recomputed the checksums).
_FAST_BLIND = {"data files swapped, checksums recomputed", "bit flip, checksums recomputed",
               "truncated, sizes recomputed", "dtype int32", "dtype float64", "step_shape [3, 1]",
               "block_rows doubled", "block_rows halved"}


def hostile_store(root: Path, fmt: str) -> tuple[Path, dict[str, Any]]:
    """A small store of ``fmt`` with two splits at ``root``, and its windows as each
    reader gives them."""
    rng = np.random.default_rng(28)
    arrays = [rng.normal(size=(n, 3)).astype(np.float32) for n in LENGTHS]
    store = wk.convert(arrays, root, format=fmt, window=HOSTILE_SPEC,
                       splits="train=0.7,val=0.3", block_rows=32, parts=3)
    assert verify_store(store.path) == []
    return store.path, _all_readers(store.path, tf=True)


class HostileStoreTests:
    """The hostile-store contract. A subclass sets ``format_name``; each test
    takes the ``fmt`` fixture, which is that name."""

    #: the name of the format under test (a key of ``windowkit.FORMATS``)
    format_name: ClassVar[str]

    @pytest.fixture
    def fmt(self) -> str:
        return self.format_name

    @pytest.fixture(scope="class")
    @classmethod
    def block_pristine(cls, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
        """A pristine store of the format, and one of other rows ("<format>-other")."""
        fmt = cls.format_name
        root = tmp_path_factory.mktemp("pristine")
        return {fmt: convert_block_store(root / fmt, fmt).path,
                f"{fmt}-other": convert_block_store(root / f"{fmt}-other", fmt, scale=2.0).path}

    @pytest.fixture
    def store(self, tmp_path: Path, block_pristine: dict[str, Path], fmt: str) -> Path:
        """A fresh copy of the pristine store of ``fmt``."""
        shutil.copytree(block_pristine[fmt], tmp_path / "s")
        return tmp_path / "s"

    @pytest.fixture(scope="class")
    @classmethod
    def hostile_pristine(cls, tmp_path_factory: pytest.TempPathFactory
                         ) -> dict[str, tuple[Path, dict]]:
        """The format's :func:`hostile_store` (by format name)."""
        fmt = cls.format_name
        return {fmt: hostile_store(tmp_path_factory.mktemp("pristine") / fmt, fmt)}

    # -- 1. block checks: a pristine store, then one block changed -------------------------------
    def test_a_pristine_store_reads_the_oracle_windows(self, store: Path) -> None:
        expected, _ = oracle_windows(_block_series(), BLOCK_SPEC)
        s = wk.open_store(store)
        for read in READERS:
            got = read(s)
            if read is _read_keras:
                assert sorted(window_keys(got)) == sorted(window_keys(expected))
            else:
                np.testing.assert_array_equal(got, expected)

    @pytest.mark.parametrize("how", ["reversed", "one value"])
    def test_a_rewritten_block_is_refused(self, store: Path, fmt: str, how: str) -> None:
        def change(rows: np.ndarray) -> np.ndarray:
            if how == "reversed":
                return rows[::-1].copy()
            rows = rows.copy()
            rows[50, 1] += 1.0  # past the halo the block before holds (TFRecord)
            return rows

        expect_errors(store, lambda p: _rewrite_block(p, fmt, 1, change),
                      "do not match the digest")

    def test_swapped_data_files_are_refused(self, store: Path, fmt: str) -> None:
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
        expect_errors(store, lambda _: _swap_files(*pair), match)

    def test_a_block_of_another_store_is_refused(self, store: Path, fmt: str,
                                                 block_pristine: dict[str, Path]) -> None:
        other = block_pristine[f"{fmt}-other"]
        name = {"zarr": "data/c/1/0", "parquet": "data/part-00001.parquet",
                "tfrecord": "data/part-00001-of-00004.tfrecord"}[fmt]
        match = {"zarr": "do not match the digest", "parquet": "belongs to store id",
                 "tfrecord": "belongs to another store"}[fmt]
        expect_errors(store, lambda p: shutil.copyfile(other / name, p / name), match)

    def test_an_edited_dtype_is_refused(self, store: Path, fmt: str) -> None:
        def change(p: Path) -> None:
            _edit_json(p / "windowkit.json", lambda m: m.update(dtype="int32"))

        match = {"zarr": "differs from the manifest", "parquet": "differ from the manifest",
                 "tfrecord": "do not match the digest"}[fmt]
        expect_errors(store, change, match)

    def test_an_edited_byte_order_or_column_type_is_refused(self, store: Path, fmt: str) -> None:
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
        expect_errors(store, change, match)

    # -- block checks: links ---------------------------------------------------------------------
    def test_a_data_file_replaced_by_a_link_to_a_fifo_after_open_is_refused(
            self, store: Path, fmt: str, tmp_path: Path) -> None:
        """Links are followed (a DVC or git-annex checkout); what they lead to
        must be a regular file, checked whenever a reader opens the file."""
        name = {"zarr": "data/c/1/0", "parquet": "data/part-00000.parquet",
                "tfrecord": "data/part-00000-of-00004.tfrecord"}

        def change(p: Path) -> None:
            os.mkfifo(tmp_path / "fifo")
            (p / name[fmt]).unlink()
            (p / name[fmt]).symlink_to(tmp_path / "fifo")

        expect_errors(store, change, "is not a regular file (a FIFO)", after_open=True)

    # -- block checks: a store replaced while it is read -------------------------------------------
    def test_blocks_of_a_replacing_store_on_s3_are_never_mixed(
            self, fmt: str, s3_bucket: str, block_pristine: dict[str, Path]) -> None:
        """A remote store whose data objects are being replaced: reading refuses the
        new blocks (no batch mixes two stores); once the manifest is replaced too,
        the error says "replaced"."""
        url = f"{s3_bucket}/s"
        fs = fsspec.filesystem("s3")
        fs.put(str(block_pristine[fmt]), url.removeprefix("s3://"), recursive=True)
        store = wk.open_store(url)
        expected, _ = oracle_windows(_block_series(), BLOCK_SPEC)
        np.testing.assert_array_equal(_read_windows(store), expected)
        other = block_pristine[f"{fmt}-other"]
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

    def test_checks_can_be_switched_off_for_the_benchmark_only(self, store: Path, fmt: str) -> None:
        from windowkit.formats import _checks

        _rewrite_block(store, fmt, 1, lambda rows: rows[::-1].copy())
        s = wk.open_store(store)
        _checks._CHECKS = False
        try:
            _read_windows(s)  # reads the changed rows: nothing checks them
        finally:
            _checks._CHECKS = True
        assert "digest" in str(_error_of(lambda: _read_windows(wk.open_store(store))))
        assert os.path.exists(store / "blocks.xxh3")

    # -- 2. hostile stores: every mutation through every reader ------------------------------------
    @pytest.mark.parametrize("name", _cases(tf=False))
    def test_a_hostile_store_is_one_error_or_the_pristine_windows(
            self, hostile_pristine: dict[str, tuple[Path, dict]], tmp_path: Path, name: str,
            fmt: str) -> None:
        root, want = mutated(hostile_pristine, tmp_path, name, fmt)
        _check(root, want, _all_readers(root, tf=False))
        problems = verify_store(root)
        assert problems, "verify says ok"
        assert all("\n" not in p for p in problems), problems
        assert verify_store(root, fast=True) or name in _FAST_BLIND, "verify --fast says ok"

    @pytest.mark.parametrize("name", _cases(tf=True))
    def test_a_hostile_store_read_by_tf_data(self, hostile_pristine: dict[str, tuple[Path, dict]],
                                             tmp_path: Path, name: str, fmt: str) -> None:
        root, want = mutated(hostile_pristine, tmp_path, name, fmt)
        _check(root, want, {"tf": _attempt(_tf, root)})
