"""Never lose or expose a user's data, in every format: ``--overwrite`` replaces only
what windowkit made, no link is followed, resume reuses only parts whose source
rows are unchanged, a store is untrusted input, reads never serve wrong rows, and
a store replaced under a reader is an error."""

from __future__ import annotations

import logging
import os
import shutil
from collections import namedtuple
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

import windowkit as wk
from tests.conftest import collect_epoch, npy_sources
from tests.helpers import (
    SPEC,
    assert_one_line_error,
    cli_convert,
    convert_sources,
    damage_a_block,
    file_tree,
    interrupted_convert,
    snapshot,
)
from windowkit.cli import main
from windowkit.errors import carried_error
from windowkit.sources import NpySeries
from windowkit.verify import verify_store


# -- 1. --overwrite replaces only what windowkit made -----------------------------------
def test_overwrite_refuses_a_directory_windowkit_did_not_write(
        tmp_path: Path, sources: list[Path], concept_format: str) -> None:
    mine = tmp_path / "mydir"
    mine.mkdir()
    (mine / "thesis.txt").write_text("three years of work")
    before = snapshot(mine)
    result = cli_convert(sources, mine, concept_format, "--overwrite")
    assert_one_line_error(result, str(mine), "'thesis.txt'", "--overwrite replaces only")
    assert snapshot(mine) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mydir", "src"]


def test_overwrite_refuses_a_store_holding_a_foreign_file(tmp_path: Path, sources: list[Path],
                                                          concept_format: str) -> None:
    store = convert_sources(sources, tmp_path / "store", concept_format)
    (store.path / "data" / "notes.txt").write_text("mine")
    before = snapshot(store.path)
    result = cli_convert(sources, store.path, concept_format, "--overwrite")
    assert_one_line_error(result, "'data/notes.txt'", "which windowkit did not write")
    assert snapshot(store.path) == before


def test_a_target_holding_the_sources_is_refused_even_with_overwrite(
        tmp_path: Path, concept_format: str) -> None:
    data = tmp_path / "data"
    data.mkdir()
    paths = npy_sources(data)
    before = snapshot(data)
    for target in (data, tmp_path):
        result = cli_convert(paths, target, concept_format, "--overwrite")
        assert_one_line_error(result, f"{target}: holds the source")
    assert snapshot(data) == before
    # also an array memory-mapped from a file inside the target
    mapped = np.load(paths[0], mmap_mode="r")
    with pytest.raises(wk.StoreExistsError, match="holds the source"):
        wk.convert({"a": mapped}, data, format=concept_format, window=SPEC, overwrite=True)


def test_overwrite_replaces_a_store_and_an_empty_directory(tmp_path: Path,
                                                           sources: list[Path],
                                                           concept_format: str) -> None:
    store = convert_sources(sources, tmp_path / "store", concept_format)
    old_id = store.manifest.store_id
    replaced = convert_sources(sources[:2], tmp_path / "store", concept_format, overwrite=True)
    assert replaced.manifest.store_id != old_id
    assert verify_store(replaced.path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src", "store"]
    (tmp_path / "empty").mkdir()
    assert verify_store(convert_sources(sources, tmp_path / "empty", concept_format).path) == []


def test_a_target_that_is_a_file_or_links_to_one_is_refused(
        tmp_path: Path, sources: list[Path], concept_format: str) -> None:
    """A link to a directory is written through (a store kept on another
    disk: tests/test_linked_stores.py); a link to anything else is refused."""
    (tmp_path / "file").write_text("x")
    assert_one_line_error(cli_convert(sources, tmp_path / "file", concept_format, "--overwrite"),
                    "exists and is not a directory")
    (tmp_path / "link").symlink_to(tmp_path / "file")
    assert_one_line_error(cli_convert(sources, tmp_path / "link", concept_format, "--overwrite"),
                    "is a symbolic link to", "which is not a directory")
    assert (tmp_path / "file").read_text() == "x"


# -- 2. no write goes through a link windowkit did not make -------------------------------
def test_a_link_planted_at_the_workspace_name_is_refused(tmp_path: Path, sources: list[Path],
                                                         concept_format: str) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me")
    (tmp_path / ".store.windowkit-partial").symlink_to(victim)
    result = cli_convert(sources, tmp_path / "store", concept_format)
    assert_one_line_error(result, ".store.windowkit-partial", "symbolic link")
    assert (victim / "precious.txt").read_text() == "keep me"
    assert sorted(p.name for p in victim.iterdir()) == ["precious.txt"]
    assert not os.path.lexists(tmp_path / "store")


def test_a_foreign_directory_at_the_workspace_name_is_refused(
        tmp_path: Path, sources: list[Path], concept_format: str) -> None:
    foreign = tmp_path / ".store.windowkit-partial"
    foreign.mkdir()
    (foreign / "precious.txt").write_text("keep me")
    result = cli_convert(sources, tmp_path / "store", concept_format)
    assert_one_line_error(result, "was not made by windowkit", "'precious.txt'")
    assert sorted(p.name for p in foreign.iterdir()) == ["precious.txt"]


# -- 3. resume reuses a part only when its source rows are unchanged --------------------
def test_resume_with_changed_arrays_starts_over(tmp_path: Path, concept_format: str,
                                                monkeypatch: pytest.MonkeyPatch,
                                                caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "store"
    zeros = {"a": np.zeros((4000, 3), np.float32)}
    ones = {"a": np.ones((4000, 3), np.float32)}
    with monkeypatch.context() as patch:
        from tests.helpers import interrupt_after

        interrupt_after(patch, concept_format, 3)
        with pytest.raises(KeyboardInterrupt):
            wk.convert(zeros, out, format=concept_format, window=SPEC, block_rows=128, parts=6)
    with caplog.at_level(logging.INFO, logger="windowkit"):
        store = wk.convert(ones, out, format=concept_format, window=SPEC, block_rows=128, parts=6)
    assert "changed since the interrupted conversion; starting over" in caplog.text
    x, y = store.windows("train", np.arange(store.num_windows("train")))
    assert (x == 1).all() and (y == 1).all()
    fresh = wk.convert(ones, tmp_path / "fresh", format=concept_format, window=SPEC, block_rows=128,
                       parts=6)
    assert file_tree(store.path) == file_tree(fresh.path)


def test_resume_rereads_a_file_changed_behind_the_same_size_and_time(
        tmp_path: Path, sources: list[Path], concept_format: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "store"
    interrupted_convert(monkeypatch, sources, out, concept_format, parts_done=3)
    first = sources[0]
    info = first.stat()
    values = np.load(first)
    values[5] += 1  # same size; the modification time is put back below
    np.save(first, values)
    os.utime(first, ns=(info.st_atime_ns, info.st_mtime_ns))
    with caplog.at_level(logging.INFO, logger="windowkit"):
        store = convert_sources(sources, out, concept_format)
    assert "the source rows of part 0 changed since the interrupted conversion" in caplog.text
    fresh = convert_sources(sources, tmp_path / "fresh", concept_format)
    assert file_tree(store.path) == file_tree(fresh.path)
    x, _ = store.windows("train", np.arange(1))
    np.testing.assert_array_equal(x[0], values[:8])


def test_a_read_error_while_resuming_keeps_the_finished_parts(
        tmp_path: Path, sources: list[Path], concept_format: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "store"
    interrupted_convert(monkeypatch, sources, out, concept_format, parts_done=3)
    with monkeypatch.context() as patch:
        def flaky(self: NpySeries, start: int, stop: int) -> np.ndarray:
            raise OSError(5, "Input/output error", self.path)

        patch.setattr(NpySeries, "read", flaky)
        with pytest.raises(OSError, match="Input/output error"):
            convert_sources(sources, out, concept_format)
    partial = tmp_path / ".store.windowkit-partial"
    assert len(list((partial / "_resume").glob("shard-*.json"))) == 3
    with caplog.at_level(logging.INFO, logger="windowkit"):
        store = convert_sources(sources, out, concept_format)
    assert "3 of 6 parts already written" in caplog.text
    assert verify_store(store.path) == []


def test_a_target_appearing_during_the_conversion_keeps_the_work(
        tmp_path: Path, sources: list[Path], concept_format: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "store"
    from windowkit.formats import get_format

    storage = get_format(concept_format)
    original = type(storage).finish

    def finish_then_someone_writes_the_target(self: Any, *args: Any) -> Any:
        out.mkdir(exist_ok=True)
        (out / "theirs.txt").write_text("someone else's")
        return original(self, *args)

    with monkeypatch.context() as patch:
        patch.setattr(type(storage), "finish", finish_then_someone_writes_the_target)
        with pytest.raises(wk.StoreExistsError, match="target exists and is not empty"):
            convert_sources(sources, out, concept_format)
        with pytest.raises(wk.StoreExistsError, match=r"holds 'theirs\.txt'"):
            convert_sources(sources, out, concept_format, overwrite=True)
    assert (out / "theirs.txt").read_text() == "someone else's"
    (out / "theirs.txt").unlink()
    with caplog.at_level(logging.INFO, logger="windowkit"):
        store = convert_sources(sources, out, concept_format)
    assert "6 of 6 parts already written" in caplog.text
    assert verify_store(store.path) == []


# -- 4. a store is untrusted input --------------------------------------------------------


# -- 5. reads never serve stale or wrong rows ---------------------------------------------
class _ShortArray:
    """An array-like that claims more rows than its slices return."""

    def __init__(self, values: np.ndarray) -> None:
        self.values, self.dtype = values, values.dtype
        self.shape = (len(values) + 10, *values.shape[1:])

    def __getitem__(self, key: slice) -> np.ndarray:
        return self.values[key]


def test_a_source_that_returns_fewer_rows_is_refused(tmp_path: Path, concept_format: str) -> None:
    source = {"a": _ShortArray(np.zeros((100, 2), np.float32))}
    with pytest.raises(wk.SourceError, match=r"series 'a': returned 100 rows for rows 0\.\.110"):
        wk.convert(source, tmp_path / "store", format=concept_format, window=4)
    assert list(tmp_path.iterdir()) == []


def test_a_pipeline_error_is_the_windowkit_error_it_carries(tmp_path: Path,
                                                           sources: list[Path]) -> None:
    import tensorflow as tf

    store = convert_sources(sources, tmp_path / "store", "tfrecord")
    dataset = wk.open_store(store.path).tf_dataset("train", 8, shuffle=False)
    damaged = damage_a_block(store)  # after the dataset is built: found reading it
    with pytest.raises(tf.errors.OpError) as caught:
        collect_epoch(dataset)
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
        tmp_path: Path, concept_format: str, monkeypatch: pytest.MonkeyPatch) -> None:
    table = tmp_path / "t.csv"
    rows = np.random.default_rng(0).normal(size=(20000, 4))
    table.write_text("a,b,c,d\n" + "\n".join(",".join(f"{v:.3f}" for v in r) for r in rows))
    usage = namedtuple("usage", "total used free")
    free = 4 << 20  # more than the CSV, less than staging it plus the store
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**12, 10**12 - free, free))
    result = CliRunner().invoke(main, ["convert", str(table), "--format", concept_format, "--out",
                                       str(tmp_path / "store"), "--window", "8", "-q"])
    assert_one_line_error(result, "not enough disk space for the staged table and the store",
                    "4.0 MiB")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]


# -- 8. a store replaced while a reader has it open ---------------------------------------


