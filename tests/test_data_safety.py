"""Never lose or expose a user's data, in every format: ``--overwrite`` replaces only
what windowkit made, no link is followed, resume reuses only parts whose source
rows are unchanged, a store is untrusted input, reads never serve wrong rows, and
a store replaced under a reader is an error."""

from __future__ import annotations

import gc
import json
import logging
import os
import pickle
import shutil
from collections import namedtuple
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

import windowkit as wk
from tests.conftest import collect_epoch
from tests.test_safety import SPEC, _convert, _interrupted_convert, _sources, _tree
from windowkit.cli import main
from windowkit.errors import carried_error
from windowkit.sources import NpySeries
from windowkit.verify import verify_store


@pytest.fixture
def sources(tmp_path: Path) -> list[Path]:
    (tmp_path / "src").mkdir()
    return _sources(tmp_path / "src")


def _cli_convert(sources: list[Path], out: Path, fmt: str, *extra: str) -> Any:
    return CliRunner().invoke(main, ["convert", *map(str, sources), "--format", fmt, "--out",
                                     str(out), "--window", "8", "-q", *extra])


def _one_line_error(result: Any, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    assert result.output.count("\n") == 1 and "Traceback" not in result.output, result.output
    for needle in needles:
        assert needle in result.output, (needle, result.output)


def _snapshot(directory: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every entry under ``directory``: size, mtime and (for files) content."""
    out = {}
    for path in sorted(directory.rglob("*")):
        info = path.lstat()
        data = path.read_bytes() if path.is_file() and not path.is_symlink() else b""
        out[str(path.relative_to(directory))] = (info.st_size, info.st_mtime_ns, data)
    return out


# -- 1. --overwrite replaces only what windowkit made -----------------------------------
def test_overwrite_refuses_a_directory_windowkit_did_not_write(
        tmp_path: Path, sources: list[Path], fmt: str) -> None:
    mine = tmp_path / "mydir"
    mine.mkdir()
    (mine / "thesis.txt").write_text("three years of work")
    before = _snapshot(mine)
    result = _cli_convert(sources, mine, fmt, "--overwrite")
    _one_line_error(result, str(mine), "'thesis.txt'", "--overwrite replaces only")
    assert _snapshot(mine) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mydir", "src"]


def test_overwrite_refuses_a_store_holding_a_foreign_file(tmp_path: Path, sources: list[Path],
                                                          fmt: str) -> None:
    store = _convert(sources, tmp_path / "store", fmt)
    (store.path / "data" / "notes.txt").write_text("mine")
    before = _snapshot(store.path)
    result = _cli_convert(sources, store.path, fmt, "--overwrite")
    _one_line_error(result, "'data/notes.txt'", "which windowkit did not write")
    assert _snapshot(store.path) == before


def test_a_target_holding_the_sources_is_refused_even_with_overwrite(
        tmp_path: Path, fmt: str) -> None:
    data = tmp_path / "data"
    data.mkdir()
    paths = _sources(data)
    before = _snapshot(data)
    for target in (data, tmp_path):
        result = _cli_convert(paths, target, fmt, "--overwrite")
        _one_line_error(result, f"{target}: holds the source")
    assert _snapshot(data) == before
    # also an array memory-mapped from a file inside the target
    mapped = np.load(paths[0], mmap_mode="r")
    with pytest.raises(wk.StoreExistsError, match="holds the source"):
        wk.convert({"a": mapped}, data, format=fmt, window=SPEC, overwrite=True)


def test_overwrite_replaces_a_store_and_an_empty_directory(tmp_path: Path,
                                                           sources: list[Path],
                                                           fmt: str) -> None:
    store = _convert(sources, tmp_path / "store", fmt)
    old_id = store.manifest.store_id
    replaced = _convert(sources[:2], tmp_path / "store", fmt, overwrite=True)
    assert replaced.manifest.store_id != old_id
    assert verify_store(replaced.path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src", "store"]
    (tmp_path / "empty").mkdir()
    assert verify_store(_convert(sources, tmp_path / "empty", fmt).path) == []


def test_a_target_that_is_a_file_or_a_link_is_refused(tmp_path: Path, sources: list[Path],
                                                      fmt: str) -> None:
    (tmp_path / "file").write_text("x")
    _one_line_error(_cli_convert(sources, tmp_path / "file", fmt, "--overwrite"),
                    "exists and is not a directory")
    victim = _convert(sources, tmp_path / "victim", fmt)
    before = _snapshot(victim.path)
    (tmp_path / "link").symlink_to(victim.path)
    _one_line_error(_cli_convert(sources, tmp_path / "link", fmt, "--overwrite"),
                    "is a symbolic link")
    assert _snapshot(victim.path) == before


# -- 2. no link is followed ---------------------------------------------------------------
def test_a_link_planted_at_the_workspace_name_is_refused(tmp_path: Path, sources: list[Path],
                                                         fmt: str) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me")
    (tmp_path / ".store.windowkit-partial").symlink_to(victim)
    result = _cli_convert(sources, tmp_path / "store", fmt)
    _one_line_error(result, ".store.windowkit-partial", "symbolic link")
    assert (victim / "precious.txt").read_text() == "keep me"
    assert sorted(p.name for p in victim.iterdir()) == ["precious.txt"]
    assert not os.path.lexists(tmp_path / "store")


def test_a_foreign_directory_at_the_workspace_name_is_refused(
        tmp_path: Path, sources: list[Path], fmt: str) -> None:
    foreign = tmp_path / ".store.windowkit-partial"
    foreign.mkdir()
    (foreign / "precious.txt").write_text("keep me")
    result = _cli_convert(sources, tmp_path / "store", fmt)
    _one_line_error(result, "was not made by windowkit", "'precious.txt'")
    assert sorted(p.name for p in foreign.iterdir()) == ["precious.txt"]


# -- 3. resume reuses a part only when its source rows are unchanged --------------------
def test_resume_with_changed_arrays_starts_over(tmp_path: Path, fmt: str,
                                                monkeypatch: pytest.MonkeyPatch,
                                                caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "store"
    zeros = {"a": np.zeros((4000, 3), np.float32)}
    ones = {"a": np.ones((4000, 3), np.float32)}
    with monkeypatch.context() as patch:
        from tests.test_safety import _interrupt_after

        _interrupt_after(patch, fmt, 3)
        with pytest.raises(KeyboardInterrupt):
            wk.convert(zeros, out, format=fmt, window=SPEC, block_rows=128, parts=6)
    with caplog.at_level(logging.INFO, logger="windowkit"):
        store = wk.convert(ones, out, format=fmt, window=SPEC, block_rows=128, parts=6)
    assert "changed since the interrupted conversion; starting over" in caplog.text
    x, y = store.windows("train", np.arange(store.num_windows("train")))
    assert (x == 1).all() and (y == 1).all()
    fresh = wk.convert(ones, tmp_path / "fresh", format=fmt, window=SPEC, block_rows=128,
                       parts=6)
    assert _tree(store.path) == _tree(fresh.path)


def test_resume_rereads_a_file_changed_behind_the_same_size_and_time(
        tmp_path: Path, sources: list[Path], fmt: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "store"
    _interrupted_convert(monkeypatch, sources, out, fmt, parts_done=3)
    first = sources[0]
    info = first.stat()
    values = np.load(first)
    values[5] += 1  # same size; the modification time is put back below
    np.save(first, values)
    os.utime(first, ns=(info.st_atime_ns, info.st_mtime_ns))
    with caplog.at_level(logging.INFO, logger="windowkit"):
        store = _convert(sources, out, fmt)
    assert "the source rows of part 0 changed since the interrupted conversion" in caplog.text
    fresh = _convert(sources, tmp_path / "fresh", fmt)
    assert _tree(store.path) == _tree(fresh.path)
    x, _ = store.windows("train", np.arange(1))
    np.testing.assert_array_equal(x[0], values[:8])


def test_a_read_error_while_resuming_keeps_the_finished_parts(
        tmp_path: Path, sources: list[Path], fmt: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "store"
    _interrupted_convert(monkeypatch, sources, out, fmt, parts_done=3)
    with monkeypatch.context() as patch:
        def flaky(self: NpySeries, start: int, stop: int) -> np.ndarray:
            raise OSError(5, "Input/output error", self.path)

        patch.setattr(NpySeries, "read", flaky)
        with pytest.raises(OSError, match="Input/output error"):
            _convert(sources, out, fmt)
    partial = tmp_path / ".store.windowkit-partial"
    assert len(list((partial / "_resume").glob("shard-*.json"))) == 3
    with caplog.at_level(logging.INFO, logger="windowkit"):
        store = _convert(sources, out, fmt)
    assert "3 of 6 parts already written" in caplog.text
    assert verify_store(store.path) == []


def test_a_target_appearing_during_the_conversion_keeps_the_work(
        tmp_path: Path, sources: list[Path], fmt: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "store"
    from windowkit.formats import get_format

    storage = get_format(fmt)
    original = type(storage).finish

    def finish_then_someone_writes_the_target(self: Any, *args: Any) -> Any:
        out.mkdir(exist_ok=True)
        (out / "theirs.txt").write_text("someone else's")
        return original(self, *args)

    with monkeypatch.context() as patch:
        patch.setattr(type(storage), "finish", finish_then_someone_writes_the_target)
        with pytest.raises(wk.StoreExistsError, match="target exists and is not empty"):
            _convert(sources, out, fmt)
        with pytest.raises(wk.StoreExistsError, match=r"holds 'theirs\.txt'"):
            _convert(sources, out, fmt, overwrite=True)
    assert (out / "theirs.txt").read_text() == "someone else's"
    (out / "theirs.txt").unlink()
    with caplog.at_level(logging.INFO, logger="windowkit"):
        store = _convert(sources, out, fmt)
    assert "6 of 6 parts already written" in caplog.text
    assert verify_store(store.path) == []


# -- 4. a store is untrusted input --------------------------------------------------------
def _edit_manifest(store: Path, edit: Any) -> None:
    path = store / "windowkit.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))


_DATA_PATH = {"tfrecord": ("shards", "path"), "zarr": None, "parquet": ("files", "path")}


def _set_data_path(manifest: dict[str, Any], fmt: str, value: str) -> None:
    if _DATA_PATH[fmt] is None:
        manifest["files"][0]["path"] = value
    else:
        key, field = _DATA_PATH[fmt]  # type: ignore[misc]
        manifest["data"][key][0][field] = value


_TAMPERING = {
    "absolute file path": (lambda m, f: m["files"][0].update(path="/etc/passwd"),
                           "must be relative"),
    "'..' in an index path": (lambda m, f: m["splits"]["train"].update(
        index="../other/index/train.parquet"), "must be relative"),
    "data file of another store": (lambda m, f: _set_data_path(
        m, f, "../other/data/part-00000.parquet"), "must be relative"),
    "huge block_rows": (lambda m, f: m.update(block_rows=2**40), "block_rows"),
    "huge step shape": (lambda m, f: m.update(step_shape=[2**20, 2**20]), "step_shape"),
    "bytes as text": (lambda m, f: m["files"][0].update(bytes="12"), "files.0.bytes"),
    "negative rows": (lambda m, f: m.update(total_rows=-1), "total_rows"),
    "unknown dtype": (lambda m, f: m.update(dtype="object"), "dtype"),
    "unknown field": (lambda m, f: m.update(extra=1), "extra"),
    "NaN statistics": (lambda m, f: m["normalization"].update(
        mean=[float("nan")] * 3), "normalization"),
    "rows that do not add up": (lambda m, f: m.update(total_rows=m["total_rows"] + 1),
                                "rows"),
}


@pytest.mark.parametrize("case", sorted(_TAMPERING))
def test_a_tampered_manifest_is_refused_on_open_and_by_verify(
        tmp_path: Path, sources: list[Path], fmt: str, case: str) -> None:
    store = _convert(sources, tmp_path / "store", fmt)
    edit, needle = _TAMPERING[case]
    _edit_manifest(store.path, lambda m: edit(m, fmt))
    before = _snapshot(store.path)
    with pytest.raises(wk.StoreError, match=r"windowkit\.json") as caught:
        wk.open_store(store.path)
    assert needle in str(caught.value) and "\n" not in str(caught.value), str(caught.value)
    problems = verify_store(store.path)
    assert problems == [str(caught.value)]
    result = CliRunner().invoke(main, ["inspect", str(store.path)])
    _one_line_error(result, needle)
    assert _snapshot(store.path) == before  # opening never writes


def test_a_link_inside_a_store_is_refused(tmp_path: Path, sources: list[Path],
                                          fmt: str) -> None:
    other = _convert(sources[:2], tmp_path / "other", fmt)
    store = _convert(sources, tmp_path / "store", fmt)
    name = sorted(str(p.relative_to(store.path)) for p in (store.path / "data").rglob("*")
                  if p.is_file())[-1]
    (store.path / name).unlink()
    (store.path / name).symlink_to(other.path / name)
    with pytest.raises(wk.StoreError, match="is a symbolic link"):
        wk.open_store(store.path)
    problems = verify_store(store.path)
    assert len(problems) == 1 and "is a symbolic link" in problems[0]


def test_a_data_file_of_another_store_is_refused_by_readers(
        tmp_path: Path, sources: list[Path], fmt: str) -> None:
    """Same name and layout, other rows: the store id in the file tells them apart
    (Zarr chunks carry none; ``verify`` names them by checksum)."""
    other = wk.convert([np.load(p) + 1 for p in sources], tmp_path / "other", format=fmt,
                       window=SPEC, block_rows=128, parts=6)
    store = _convert(sources, tmp_path / "store", fmt)
    name = "data/zarr.json" if fmt == "zarr" else next(
        f.path for f in store.manifest.files if f.path.startswith("data/part-"))
    shutil.copyfile(other.path / name, store.path / name)
    assert any(f"{store.path / name}:" in p for p in verify_store(store.path))
    copied = store.path / name
    with pytest.raises(wk.StoreError) as refused:
        store = wk.open_store(store.path)
        store.windows("train", np.arange(store.num_windows("train")))
    # the store id (or, where another id shifts a record's bytes, its framing) tells
    message = str(refused.value)
    assert str(copied) in message, message
    assert any(why in message for why in ("differs from the manifest", "belongs to",
                                          "its header says", "fails its CRC check")), message


def test_opening_and_reading_never_write(tmp_path: Path, sources: list[Path],
                                         fmt: str) -> None:
    store = _convert(sources, tmp_path / "store", fmt)
    before = _snapshot(tmp_path)
    opened = wk.open_store(store.path)
    opened.windows("train", np.arange(opened.num_windows("train")))
    collect_epoch(opened.tf_dataset("train", 64))
    opened.keras_dataset("train", 64)[0]
    assert verify_store(store.path) == []
    assert CliRunner().invoke(main, ["inspect", str(store.path)]).exit_code == 0
    assert _snapshot(tmp_path) == before


# -- 5. reads never serve stale or wrong rows ---------------------------------------------
class _ShortArray:
    """An array-like that claims more rows than its slices return."""

    def __init__(self, values: np.ndarray) -> None:
        self.values, self.dtype = values, values.dtype
        self.shape = (len(values) + 10, *values.shape[1:])

    def __getitem__(self, key: slice) -> np.ndarray:
        return self.values[key]


def test_a_source_that_returns_fewer_rows_is_refused(tmp_path: Path, fmt: str) -> None:
    source = {"a": _ShortArray(np.zeros((100, 2), np.float32))}
    with pytest.raises(wk.SourceError, match=r"series 'a': returned 100 rows for rows 0\.\.110"):
        wk.convert(source, tmp_path / "store", format=fmt, window=4)
    assert list(tmp_path.iterdir()) == []


def test_a_memory_error_while_reading_is_not_called_corruption(
        tmp_path: Path, sources: list[Path], fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    store = _convert(sources, tmp_path / "store", fmt)
    reader_type = type(store.row_reader().inner)  # the format's reader, inside the checks
    name = {"tfrecord": "_decode", "zarr": "_decode", "parquet": "_read_groups"}[fmt]

    def out_of_memory(*args: object) -> None:
        raise MemoryError("no memory")

    monkeypatch.setattr(reader_type, name, out_of_memory)
    with pytest.raises(MemoryError):
        wk.open_store(store.path).windows("train", np.arange(4))


def _damage_a_block(store: wk.Store) -> Path:
    """Flip a byte in the middle of the store's first data file (not its metadata)."""
    damaged = sorted(p for p in (store.path / "data").rglob("*")
                     if p.is_file() and p.name not in ("zarr.json", "records.parquet",
                                                       "_blocks.xxh3"))[0]
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0x55
    damaged.write_bytes(bytes(data))
    return damaged


def test_a_damaged_block_error_keeps_its_cause(tmp_path: Path, sources: list[Path],
                                               fmt: str) -> None:
    store = _convert(sources, tmp_path / "store", fmt)
    _damage_a_block(store)
    with pytest.raises(wk.StoreError) as caught:
        wk.open_store(store.path).windows("train", np.arange(store.num_windows("train")))
    assert caught.value.__cause__ is not None


@pytest.mark.parametrize("reader", ["tf", "keras"])
def test_bench_of_a_damaged_store_is_one_line(tmp_path: Path, sources: list[Path], fmt: str,
                                              reader: str) -> None:
    """The tf.data reader's error comes through TensorFlow (its traceback inside):
    the command still prints the windowkit line alone, naming where in the store
    (the file; for Zarr, the array and its chunks)."""
    store = _convert(sources, tmp_path / "store", fmt)
    _damage_a_block(store)
    result = CliRunner().invoke(main, ["bench", str(store.path), "--reader", reader,
                                       "--batch-size", "8", "--warmup", "1", "--shuffle", "none"])
    _one_line_error(result, f"windowkit: error: {store.path / 'data'}")


def test_a_pipeline_error_is_the_windowkit_error_it_carries(tmp_path: Path,
                                                           sources: list[Path]) -> None:
    import tensorflow as tf

    store = _convert(sources, tmp_path / "store", "tfrecord")
    damaged = _damage_a_block(store)
    with pytest.raises(tf.errors.OpError) as caught:
        collect_epoch(wk.open_store(store.path).tf_dataset("train", 8, shuffle=False))
    carried = carried_error(caught.value)
    assert isinstance(carried, wk.StoreError) and "\n" not in str(carried)
    assert str(carried).startswith(f"{damaged}: record "), carried
    # a traceback that ends in another error (a bug, say) is never relabelled
    bug = tf.errors.UnknownError(None, None, f"{caught.value.message}\n\nDuring handling of "
                                 "the above exception, another exception occurred:\n\n"
                                 "IndexError: index 9 is out of bounds")
    assert carried_error(bug) is None


# -- 6. disk space, table staging included ------------------------------------------------
def test_too_little_space_for_staging_a_table_is_refused_before_writing(
        tmp_path: Path, fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    table = tmp_path / "t.csv"
    rows = np.random.default_rng(0).normal(size=(20000, 4))
    table.write_text("a,b,c,d\n" + "\n".join(",".join(f"{v:.3f}" for v in r) for r in rows))
    usage = namedtuple("usage", "total used free")
    free = 4 << 20  # more than the CSV, less than staging it plus the store
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**12, 10**12 - free, free))
    result = CliRunner().invoke(main, ["convert", str(table), "--format", fmt, "--out",
                                       str(tmp_path / "store"), "--window", "8", "-q"])
    _one_line_error(result, "not enough disk space for the staged table and the store",
                    "4.0 MiB")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]


# -- 8. a store replaced while a reader has it open ---------------------------------------
def _replace(store: wk.Store, sources: list[Path], fmt: str) -> None:
    wk.convert([np.load(p) * 2 for p in sources], store.path, format=fmt, window=SPEC,
               block_rows=128, parts=6, overwrite=True)


def test_a_replaced_store_is_an_error_for_random_access(tmp_path: Path, sources: list[Path],
                                                        fmt: str) -> None:
    store = _convert(sources, tmp_path / "store", fmt)
    store.windows("train", np.arange(4))
    _replace(store, sources, fmt)
    with pytest.raises(wk.StoreReplacedError, match="was replaced while it was being read"):
        store.windows("train", np.arange(store.num_windows("train")))


def test_a_replaced_store_is_an_error_for_tf_dataset(tmp_path: Path, sources: list[Path],
                                                     fmt: str) -> None:
    store = _convert(sources, tmp_path / "store", fmt)
    iterator = iter(store.tf_dataset("train", 32, shuffle=False, cache_bytes=1))
    next(iterator)
    _replace(store, sources, fmt)
    try:
        with pytest.raises(Exception, match="replaced while it was being read") as caught:
            for _ in iterator:
                pass
        assert "tensorflow" in type(caught.value).__module__ or isinstance(
            caught.value, wk.StoreReplacedError)
    finally:  # stop its background reads before the next test writes a store
        del iterator, caught
        gc.collect()


def test_a_replaced_store_is_an_error_for_keras_workers(tmp_path: Path, sources: list[Path],
                                                        fmt: str) -> None:
    store = _convert(sources, tmp_path / "store", fmt)
    dataset = store.keras_dataset("train", 32, cache_bytes=1)
    dataset[0]
    shipped = pickle.dumps(dataset)  # what a worker process receives
    _replace(store, sources, fmt)
    in_worker = pickle.loads(shipped)
    with pytest.raises(wk.StoreReplacedError, match="was replaced"):
        in_worker[1]  # a worker's first read checks the store id
    with pytest.raises(wk.StoreReplacedError, match="was replaced"):
        for i in range(len(dataset)):
            dataset[i]
