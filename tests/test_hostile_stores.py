"""Hostile stores: a list of mutations of a small store of every format, each run
through ``open_store``, ``Store.windows`` (plain and normalized), ``keras_dataset``,
``tf_dataset`` (one epoch each) and ``verify``. Every reader must give one windowkit
error (one line; through TensorFlow, the error it carries) or exactly the pristine
windows, and ``verify`` must name a problem: a store is untrusted input.

Mutations edit the manifest, the index and series tables, and the data files
(swaps, bit flips, truncations, links), many of them with the manifest's sizes and
SHA-256 recomputed, as someone forging a store would."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import windowkit as wk
from tests.conftest import IMPLEMENTED_FORMATS, collect_epoch
from windowkit.cli import main
from windowkit.errors import carried_error
from windowkit.manifest import file_digest
from windowkit.verify import verify_store

SPEC = wk.WindowSpec(8, stride=2, horizon=2)
LENGTHS = (300, 170, 40)
Mutation = Callable[[Path, str], None]


# -- the pristine stores, once per module ---------------------------------------------------
@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict]]:
    """Per format: a small store with two splits, and its windows as each reader gives them."""
    rng = np.random.default_rng(28)
    arrays = [rng.normal(size=(n, 3)).astype(np.float32) for n in LENGTHS]
    root = tmp_path_factory.mktemp("pristine")
    out = {}
    for fmt in IMPLEMENTED_FORMATS:
        store = wk.convert(arrays, root / fmt, format=fmt, window=SPEC,
                           splits="train=0.7,val=0.3", block_rows=32, parts=3)
        assert verify_store(store.path) == []
        out[fmt] = (store.path, _all_readers(store.path, tf=True))
    return out


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


def _tf(path: Path) -> Any:
    return collect_epoch(wk.open_store(path).tf_dataset("train", 16, shuffle=False))


def _all_readers(path: Path, *, tf: bool) -> dict[str, Any]:
    readers: dict[str, Callable[[Path], Any]] = {
        "open": lambda p: wk.open_store(p).splits, "index": _index, "windows": _windows,
        "normalized": _normalized, "keras": _keras}
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
    path = root / files[0]
    copy = root.parent / f"{root.name}-copy-{path.name}"
    shutil.copyfile(path, copy)
    path.unlink()
    path.symlink_to(copy)


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
    "data file a link": data_edit(_link, rehash=False),
    "data file missing": data_edit(lambda root, files: (root / files[0]).unlink(),
                                   rehash=False),
}

#: A representative few whose ``tf_dataset`` epoch runs in the fast suite (all: slow).
TF_FAST = {"normalization mean 1e308", "index start in val rows", "index length changed",
           "series rows swapped", "bit flip", "data files swapped, checksums recomputed"}


def _cases(tf: bool) -> list[Any]:
    out = []
    for name in MUTATIONS:
        for fmt in IMPLEMENTED_FORMATS:
            marks: list[Any] = []
            if tf and name not in TF_FAST:
                marks.append(pytest.mark.slow)
            out.append(pytest.param(name, fmt, marks=marks, id=f"{name}-{fmt}"))
    return out


def _mutated(pristine: dict[str, tuple[Path, dict]], tmp_path: Path, name: str,
             fmt: str) -> tuple[Path, dict]:
    source, readers = pristine[fmt]
    root = tmp_path / "store"
    shutil.copytree(source, root, symlinks=True)
    MUTATIONS[name](root, fmt)
    return root, readers


def _check(root: Path, want: dict[str, Any], got: dict[str, Any]) -> None:
    for reader, (kind, value) in got.items():
        if kind == "ok":
            assert _same(value, want[reader][1]), f"{reader}: other windows than the store's"


@pytest.mark.parametrize(("name", "fmt"), _cases(tf=False))
def test_a_hostile_store_is_one_error_or_the_pristine_windows(
        pristine: dict[str, tuple[Path, dict]], tmp_path: Path, name: str, fmt: str) -> None:
    root, want = _mutated(pristine, tmp_path, name, fmt)
    _check(root, want, _all_readers(root, tf=False))
    problems = verify_store(root)
    assert problems, "verify says ok"
    assert all("\n" not in p for p in problems), problems
    assert verify_store(root, fast=True) or name in _FAST_BLIND, "verify --fast says ok"


#: What only decoding finds (a forger recomputed the checksums).
_FAST_BLIND = {"data files swapped, checksums recomputed", "bit flip, checksums recomputed",
               "truncated, sizes recomputed", "dtype int32", "dtype float64", "step_shape [3, 1]",
               "block_rows doubled", "block_rows halved"}


@pytest.mark.parametrize(("name", "fmt"), _cases(tf=True))
def test_a_hostile_store_read_by_tf_data(pristine: dict[str, tuple[Path, dict]],
                                          tmp_path: Path, name: str, fmt: str) -> None:
    root, want = _mutated(pristine, tmp_path, name, fmt)
    _check(root, want, {"tf": _attempt(_tf, root)})


#: What used to end in a traceback (RecursionError, KeyError, ArrowInvalid).
_TRACEBACKS = ["manifest nested 100k deep", "index is series.parquet", "index is a data file",
               "index without start", "index series as strings", "series rows as int32",
               "series without row_offset", "series is an index table"]


@pytest.mark.parametrize("name", _TRACEBACKS)
def test_the_commands_say_one_line(pristine: dict[str, tuple[Path, dict]], tmp_path: Path,
                                   name: str) -> None:
    """``verify`` lists problems (exit 1), ``inspect`` and ``bench`` refuse with one
    line (exit 2); never a traceback."""
    root, _ = _mutated(pristine, tmp_path, name, "parquet")
    for fast in ([], ["--fast"]):
        result = CliRunner().invoke(main, ["verify", str(root), "-q", *fast])
        assert result.exit_code == 1, result.output
        lines = result.output.splitlines()
        assert lines and all(line.startswith(f"windowkit: verify: {root}") for line in lines), \
            result.output
    for command in (["inspect", str(root)], ["bench", str(root), "--reader", "keras",
                                             "--batch-size", "8", "--warmup", "1",
                                             "--shuffle", "none"]):
        result = CliRunner().invoke(main, command)
        assert "Traceback" not in result.output, result.output
        if result.exit_code != 0:  # inspect reads the manifest, not the tables
            assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
            assert result.output.startswith(f"windowkit: error: {root}"), result.output


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int64", "uint8"])
def test_statistics_of_real_values_pass_the_checks(tmp_path: Path, dtype: str) -> None:
    """A constant column (std 0, or a rounding error's worth), huge and tiny values
    and every dtype: what conversion writes always opens and normalizes finitely."""
    rng = np.random.default_rng(1)
    info = np.finfo(dtype) if np.dtype(dtype).kind == "f" else np.iinfo(dtype)
    big = min(float(info.max) / 8, 1e30)
    values = np.clip(np.stack([np.full(500, 0.1), rng.normal(size=500) * big,
                               rng.normal(size=500) * 1e-3, np.full(500, big)], axis=1),
                     float(info.min), float(info.max)).astype(dtype)
    store = wk.convert([values[:300], values[300:]], tmp_path / "s", format="zarr",
                       window=wk.WindowSpec(4), splits="train=0.5,val=0.5")
    x = wk.open_store(store.path).windows("train", np.arange(store.num_windows("train")),
                                          normalize=True)
    assert np.isfinite(x).all()
    assert verify_store(store.path) == []
