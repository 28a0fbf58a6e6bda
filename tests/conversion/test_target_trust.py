"""Conversion targets trust nothing (issue 28): ``--overwrite`` deletes only a
valid store's own, unchanged files; the workspace is never inside the target;
a manifest that would not open is never published; a remote store being
replaced keeps opening and reading as the old one until the new manifest is
written (the new one under a generation folder); a stale S3 lock is taken
over by one conditional write."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest
from click.testing import CliRunner

import windowkit as wk
from tests.conftest import oracle_windows
from tests.helpers import (
    SPEC,
    assert_one_line_error,
    cli_convert,
    convert_sources,
    random_series,
    snapshot,
)
from windowkit.cli import main
from windowkit.conversion import _pipeline, _remote
from windowkit.errors import carried_error
from windowkit.location import resolve
from windowkit.verify import verify_store

FORGED = {"format_version": 2, "files": [{"path": "thesis.txt"}]}


def _s3(url: str) -> str:
    return url.removeprefix("s3://")


# -- local targets ------------------------------------------------------------------------
def test_a_forged_manifest_is_refused_and_nothing_is_deleted(tmp_path: Path,
                                                             sources: list[Path],
                                                             concept_format: str) -> None:
    forged = tmp_path / "forged"
    forged.mkdir()
    (forged / "thesis.txt").write_text("thesis\n")
    (forged / "windowkit.json").write_text(json.dumps(FORGED))
    before = snapshot(forged)
    result = cli_convert(sources, forged, concept_format, "--overwrite")
    assert_one_line_error(result, str(forged), "windowkit.json does not open as one",
                    "nothing was changed")
    assert snapshot(forged) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["forged", "src"]


def test_a_valid_manifest_listing_a_users_file_does_not_delete_it(
        tmp_path: Path, sources: list[Path], concept_format: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A real store's manifest edited to list the user's file (a digest the file
    does not have): the old store is replaced, the user's file kept and named."""
    store = convert_sources(sources, tmp_path / "store", concept_format)
    thesis = store.path / "thesis.txt"
    thesis.write_text("three years of work")
    manifest = json.loads((store.path / "windowkit.json").read_text())
    manifest["files"].append({"path": "thesis.txt", "bytes": thesis.stat().st_size,
                              "sha256": "0" * 64})
    (store.path / "windowkit.json").write_text(json.dumps(manifest))
    wk.open_store(store.path)  # it opens: the same rules as --overwrite's
    with caplog.at_level(logging.WARNING, logger="windowkit"):
        result = cli_convert(sources[:2], store.path, concept_format, "--overwrite")
    assert result.exit_code == 0, result.output
    assert "kept 'thesis.txt' of the replaced store" in caplog.text
    [retired] = tmp_path.glob(".store.windowkit-old-*")
    assert sorted(p.name for p in retired.iterdir()) == ["thesis.txt"]
    assert (retired / "thesis.txt").read_text() == "three years of work"
    assert wk.open_store(store.path).manifest.series.count == 2


def test_a_listed_file_the_user_changed_is_kept(tmp_path: Path, sources: list[Path],
                                                concept_format: str,
                                                caplog: pytest.LogCaptureFixture) -> None:
    """Changed size: refused before anything is touched. Same size, other bytes
    (seen only by its SHA-256, at deletion): kept and named in a warning."""
    store = convert_sources(sources, tmp_path / "store", concept_format)
    series = store.path / "series.parquet"
    original = series.read_bytes()
    series.write_bytes(original + b"mine")
    before = snapshot(store.path)
    assert_one_line_error(cli_convert(sources, store.path, concept_format, "--overwrite"),
                    "'series.parquet' was changed since windowkit wrote it",
                    "nothing was changed")
    assert snapshot(store.path) == before
    edited = bytes([original[0] ^ 1]) + original[1:]
    series.write_bytes(edited)
    with caplog.at_level(logging.WARNING, logger="windowkit"):
        result = cli_convert(sources[:2], store.path, concept_format, "--overwrite")
    assert result.exit_code == 0, result.output
    assert "kept 'series.parquet' of the replaced store" in caplog.text
    [retired] = tmp_path.glob(".store.windowkit-old-*")
    assert [p.name for p in retired.iterdir()] == ["series.parquet"]
    assert (retired / "series.parquet").read_bytes() == edited


@pytest.mark.parametrize("out", [".", "./", "here/..", ".."])
def test_the_current_directory_is_refused_as_a_target(tmp_path: Path, sources: list[Path],
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      out: str) -> None:
    here = tmp_path / "cwd" / "here"
    here.mkdir(parents=True)
    monkeypatch.chdir(here.parent if out == "here/.." else here)
    before = snapshot(tmp_path)
    for extra in ((), ("--overwrite",)):
        result = CliRunner().invoke(main, ["convert", *map(str, sources), "--format", "zarr",
                                           "--out", out, "--window", "8", "-q", *extra])
        assert_one_line_error(result, "is the current directory or holds it")
    assert snapshot(tmp_path) == before  # no workspace, inside or beside


def test_the_workspace_of_a_relative_target_is_beside_it(tmp_path: Path,
                                                         sources: list[Path]) -> None:
    from windowkit.conversion import Workspace

    os.chdir(tmp_path)
    try:
        for out in ("s/.", "s/sub/..", "s"):
            assert Workspace(Path(out)).root == tmp_path / ".s.windowkit-partial"
    finally:
        os.chdir("/")


def _unopenable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The conversion writes a manifest that opening would refuse (9 step dims)."""
    real = _pipeline.finalize

    def finalize(*args: Any, **kwargs: Any) -> Any:
        return real(*args, **kwargs).model_copy(update={"step_shape": (1,) * 9})

    monkeypatch.setattr(_pipeline, "finalize", finalize)


def test_a_manifest_that_would_not_open_is_not_published(
        tmp_path: Path, sources: list[Path], concept_format: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    old = convert_sources(sources, tmp_path / "store", concept_format)
    before = snapshot(old.path)
    _unopenable(monkeypatch)
    with pytest.raises(wk.StoreError, match=r"step_shape.*nothing was published"):
        convert_sources(sources[:2], tmp_path / "store", concept_format, overwrite=True)
    with pytest.raises(wk.StoreError, match="nothing was published"):
        convert_sources(sources, tmp_path / "new", concept_format)
    assert snapshot(old.path) == before
    assert not os.path.lexists(tmp_path / "new")


# -- object storage -----------------------------------------------------------------------
def test_a_forged_remote_manifest_is_refused_and_nothing_is_deleted(
        s3_bucket: str, mirror_cache: Path) -> None:
    url = f"{s3_bucket}/forged"
    fs = fsspec.filesystem("s3")
    fs.pipe(f"{_s3(url)}/thesis.txt", b"thesis\n")
    fs.pipe(f"{_s3(url)}/windowkit.json", json.dumps(FORGED).encode())
    npy = mirror_cache.parent / "s0.npy"
    np.save(npy, np.arange(600, dtype=np.float32).reshape(200, 3))
    result = CliRunner().invoke(main, ["convert", str(npy), "--format", "zarr", "--window",
                                       "32", "--overwrite", "--out", url, "-q"])
    assert_one_line_error(result, "windowkit.json does not open as one", "nothing was changed")
    assert sorted(fs.find(_s3(s3_bucket))) == [f"{_s3(url)}/thesis.txt",
                                               f"{_s3(url)}/windowkit.json"]
    assert fs.cat(f"{_s3(url)}/thesis.txt") == b"thesis\n"


def test_a_remote_object_the_user_changed_is_refused(s3_bucket: str, concept_format: str,
                                                     mirror_cache: Path) -> None:
    url = f"{s3_bucket}/s"
    series = random_series([300, 200])
    wk.convert(series, url, format=concept_format, window=8, block_rows=64)
    fs = fsspec.filesystem("s3")
    key = f"{_s3(url)}/series.parquet"
    original = fs.cat(key)
    for changed in (original + b"x", bytes([original[0] ^ 1]) + original[1:]):
        fs.pipe(key, changed)
        before = {name: fs.cat(name) for name in fs.find(_s3(s3_bucket))}
        with pytest.raises(wk.StoreExistsError, match=r"'series\.parquet' was changed since"):
            wk.convert(series[:1], url, format=concept_format, window=8, overwrite=True)
        assert {name: fs.cat(name) for name in fs.find(_s3(s3_bucket))} == before
    fs.pipe(key, original)
    store = wk.convert(series[:1], url, format=concept_format, window=8, overwrite=True)
    assert store.manifest.series.count == 1


@pytest.mark.parametrize("root", ["", "/"])
def test_a_bucket_root_is_refused_in_one_line(s3_bucket: str, mirror_cache: Path,
                                              root: str) -> None:
    npy = mirror_cache.parent / "s0.npy"
    np.save(npy, np.arange(300, dtype=np.float32).reshape(100, 3))
    result = CliRunner().invoke(main, ["convert", str(npy), "--format", "zarr", "--window",
                                       "8", "--out", s3_bucket + root, "-q"])
    assert_one_line_error(result, "is a bucket root", "/store")
    assert fsspec.filesystem("s3").find(_s3(s3_bucket)) == []
    assert not list(mirror_cache.glob("remote/*/*"))


def test_a_remote_manifest_that_would_not_open_is_not_published(
        s3_bucket: str, mirror_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"{s3_bucket}/s"
    _unopenable(monkeypatch)
    with pytest.raises(wk.StoreError, match="nothing was published"):
        wk.convert(random_series([200]), url, format="parquet", window=8)
    assert not fsspec.filesystem("s3").exists(f"{_s3(url)}/windowkit.json")


def _epoch(dataset: Any) -> np.ndarray:
    """Every batch of one epoch of a Keras reader, in order."""
    return np.concatenate([dataset[i] for i in range(len(dataset))])


def _tf_epoch(dataset: Any) -> np.ndarray:
    """One epoch of a ``tf.data`` reader, its errors as windowkit's."""
    try:
        return np.concatenate([batch.numpy() for batch in dataset])
    except Exception as exc:
        raise carried_error(exc) or exc from None


def test_a_remote_store_being_replaced_keeps_opening_and_reading_until_the_swap(
        s3_bucket: str, concept_format: str, mirror_cache: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Paused after the new store is uploaded, just before its manifest is
    written: a reader of the old store reads exactly the old windows, and
    opening gives the old store. After the swap the old reader says the store
    was replaced, a new open reads exactly the new windows, and only the new
    store's objects remain (under its generation folder)."""
    from windowkit import guard as manifest_module

    url = f"{s3_bucket}/s"
    old, new = random_series([300, 200]), random_series([250], seed=1)
    spec = wk.WindowSpec(8)
    old_windows, new_windows = oracle_windows(old, spec)[0], oracle_windows(new, spec)[0]
    first = wk.convert(old, url, format=concept_format, window=8, block_rows=64)
    assert first.manifest.root == ""  # a first conversion: today's layout
    reader = wk.open_store(url).keras_dataset("train", batch_size=64, shuffle=False)
    graph = wk.open_store(url).tf_dataset("train", batch_size=64, shuffle=False)
    commit = _remote.commit
    paused: list[wk.Store] = []

    def paused_commit(*args: Any) -> None:
        np.testing.assert_array_equal(_epoch(reader), old_windows)
        reader.on_epoch_end()
        np.testing.assert_array_equal(_tf_epoch(graph), old_windows)
        opened = wk.open_store(url)
        np.testing.assert_array_equal(opened.windows("train", np.arange(len(old_windows))),
                                      old_windows)
        paused.append(opened)
        commit(*args)

    monkeypatch.setattr(_remote, "commit", paused_commit)
    store = wk.convert(new, url, format=concept_format, window=8, block_rows=64, overwrite=True)
    assert len(paused) == 1 and paused[0].manifest.store_id == first.manifest.store_id
    assert store.manifest.root == f"g-{store.manifest.store_id[:16]}"
    monkeypatch.setattr(manifest_module, "REMOTE_CHECK_SECONDS", 0.0)
    for stale in (reader, paused[0].keras_dataset("train", batch_size=64, shuffle=False)):
        with pytest.raises(wk.StoreReplacedError, match="replaced while it was being read"):
            _epoch(stale)
    with pytest.raises(wk.StoreReplacedError, match="replaced while it was being read"):
        _tf_epoch(graph)
    np.testing.assert_array_equal(_epoch(wk.open_store(url).keras_dataset(
        "train", batch_size=64, shuffle=False)), new_windows)
    listed = {f"{_s3(url)}/{store.manifest.root}/{e.path}" for e in store.manifest.files}
    assert set(fsspec.filesystem("s3").find(_s3(s3_bucket))) == listed | {
        f"{_s3(url)}/windowkit.json"}
    monkeypatch.setattr(_remote, "commit", commit)  # the same store again: another folder
    again = wk.convert(old, url, format=concept_format, window=8, block_rows=64, overwrite=True)
    assert again.manifest.root == f"g-{first.manifest.store_id[:16]}"
    same = wk.convert(old, url, format=concept_format, window=8, block_rows=64, overwrite=True)
    assert same.manifest.root == f"g-{first.manifest.store_id[16:]}"  # never its own folder
    np.testing.assert_array_equal(same.windows("train", np.arange(len(old_windows))),
                                  old_windows)
    assert all(key.startswith(f"{_s3(url)}/{same.manifest.root}/")
               for key in fsspec.filesystem("s3").find(_s3(s3_bucket))
               if not key.endswith("/windowkit.json"))


@pytest.mark.parametrize("killed", ["before the swap", "after the swap"])
def test_an_interrupted_replacement_keeps_a_store_and_the_same_command_finishes_it(
        s3_bucket: str, concept_format: str, mirror_cache: Path,
        monkeypatch: pytest.MonkeyPatch, killed: str) -> None:
    """A replacement killed before its manifest leaves the old store opening and
    reading; one killed after it, the new store. Either way the same command
    again publishes the new store and leaves only its objects."""
    url = f"{s3_bucket}/s"
    old, new = random_series([300, 200]), random_series([250], seed=1)
    spec = wk.WindowSpec(8)
    wk.convert(old, url, format=concept_format, window=8, block_rows=64)
    commit = _remote.commit

    def interrupted(*args: Any) -> None:
        if killed == "after the swap":
            commit(*args)
        raise KeyboardInterrupt

    monkeypatch.setattr(_remote, "commit", interrupted)
    with pytest.raises(KeyboardInterrupt):
        wk.convert(new, url, format=concept_format, window=8, block_rows=64, overwrite=True)
    monkeypatch.setattr(_remote, "commit", commit)
    now = old if killed == "before the swap" else new
    expected = oracle_windows(now, spec)[0]
    np.testing.assert_array_equal(
        wk.open_store(url).windows("train", np.arange(len(expected))), expected)
    store = wk.convert(new, url, format=concept_format, window=8, block_rows=64, overwrite=True)
    expected = oracle_windows(new, spec)[0]
    np.testing.assert_array_equal(store.windows("train", np.arange(len(expected))), expected)
    listed = {f"{_s3(url)}/{key}" for key in store.manifest.file_keys()}
    assert set(fsspec.filesystem("s3").find(_s3(s3_bucket))) == listed | {
        f"{_s3(url)}/windowkit.json"}
    assert verify_store(url) == []


def test_a_first_remote_store_being_published_says_so(
        s3_bucket: str, concept_format: str, mirror_cache: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Paused before the manifest of a first conversion: opening says a
    conversion is publishing the store (never "corrupt"); then it opens."""
    url = f"{s3_bucket}/s"
    commit = _remote.commit
    seen: list[str] = []

    def paused_commit(*args: Any) -> None:
        with pytest.raises(wk.StoreError) as opened:
            wk.open_store(url)
        seen.append(str(opened.value))
        commit(*args)

    monkeypatch.setattr(_remote, "commit", paused_commit)
    store = wk.convert(random_series([300]), url, format=concept_format, window=8, block_rows=64)
    assert len(seen) == 1 and "a conversion is publishing one here" in seen[0], seen
    assert store.manifest.root == "" and store.num_windows("train") > 0


def test_a_manifest_root_must_be_one_folder_of_the_store(tmp_path: Path, sources: list[Path],
                                                          concept_format: str) -> None:
    """A local store keeps its layout (no ``root`` in its manifest); a ``root``
    that is not one plain folder name is refused when opening."""
    store = convert_sources(sources, tmp_path / "s", concept_format)
    path = store.path / "windowkit.json"
    raw = json.loads(path.read_text())
    assert "root" not in raw and store.root == store.path
    for bad in ("..", "../other", "a/b", "/abs", ".hidden"):
        path.write_text(json.dumps({**raw, "root": bad}))
        with pytest.raises(wk.StoreError, match="root"):
            wk.open_store(store.path)


# -- the S3 lock --------------------------------------------------------------------------
def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _plant_stale_lock(url: str) -> str:
    lock = _s3(url) + _remote.LOCK_SUFFIX
    fsspec.filesystem("s3").pipe(lock, json.dumps(
        {"host": socket.gethostname(), "pid": _dead_pid()}).encode())
    return lock


def test_of_two_takeovers_of_a_stale_lock_exactly_one_wins(
        s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both judge the lock stale by the same ETag before either writes; one
    conditional write wins, the other is refused and deletes nothing."""
    url = f"{s3_bucket}/s"
    lock = _plant_stale_lock(url)
    both_judged = threading.Barrier(2, timeout=30)
    stale = _remote._stale
    monkeypatch.setattr(_remote, "_stale", lambda raw: (stale(raw), both_judged.wait())[0])
    winner_holds, release = threading.Event(), threading.Event()
    outcomes: dict[str, Any] = {}

    def run(name: str) -> None:
        try:
            with _remote.remote_lock(resolve(url)):
                outcomes[name] = json.loads(fsspec.filesystem("s3").cat(lock))
                winner_holds.set()
                release.wait(30)
        except wk.StoreExistsError as exc:
            outcomes[name] = exc

    threads = [threading.Thread(target=run, args=(name,)) for name in "ab"]
    for thread in threads:
        thread.start()
    assert winner_holds.wait(30)
    errors = [v for v in outcomes.values() if isinstance(v, Exception)]
    for _ in range(300):  # the loser has given up (and deleted nothing)
        errors = [v for v in outcomes.values() if isinstance(v, Exception)]
        if errors:
            break
        threading.Event().wait(0.1)
    assert len(errors) == 1 and "took over the stale lock first" in str(errors[0])
    [held] = [v for v in outcomes.values() if isinstance(v, dict)]
    fs = fsspec.filesystem("s3")
    fs.invalidate_cache()
    assert json.loads(fs.cat(lock)) == held  # the winner's lock is still there
    release.set()
    for thread in threads:
        thread.join(30)
    fs.invalidate_cache()
    assert not fs.exists(lock)  # the winner released its own lock


def test_a_lock_taken_over_meanwhile_is_never_deleted(
        s3_bucket: str, caplog: pytest.LogCaptureFixture) -> None:
    url = f"{s3_bucket}/s"
    lock = _s3(url) + _remote.LOCK_SUFFIX
    fs = fsspec.filesystem("s3")
    someone_else = json.dumps({"host": "elsewhere", "pid": 1, "token": "theirs"}).encode()
    with caplog.at_level(logging.WARNING, logger="windowkit"), \
            _remote.remote_lock(resolve(url)):
        fs.pipe(lock, someone_else)  # another process took it (wrongly) meanwhile
    fs.invalidate_cache()
    assert fs.cat(lock) == someone_else
    assert "no longer this conversion's" in caplog.text


def test_a_stale_lock_is_taken_over_by_one_conversion(s3_bucket: str,
                                                      mirror_cache: Path) -> None:
    url = f"{s3_bucket}/s"
    lock = _plant_stale_lock(url)
    series = random_series([200])
    store = wk.convert(series, url, format="zarr", window=SPEC)
    assert store.num_windows("train") == len(oracle_windows(series, SPEC)[0])
    fsspec.filesystem("s3").invalidate_cache()
    assert not fsspec.filesystem("s3").exists(lock)
