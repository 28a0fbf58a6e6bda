"""Conversion targets trust nothing (issue 28): ``--overwrite`` deletes only a
valid store's own, unchanged files; the workspace is never inside the target;
a manifest that would not open is never published; a remote store being
replaced says so; a stale S3 lock is taken over by one conditional write."""

from __future__ import annotations

import dataclasses
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
from tests.test_data_safety import _cli_convert, _one_line_error, _snapshot
from tests.test_remote import _series, mirror_cache  # noqa: F401 (a fixture)
from tests.test_safety import SPEC, _convert, _sources
from windowkit.cli import main
from windowkit.conversion import _pipeline, _remote
from windowkit.location import resolve

FORGED = {"format_version": 2, "files": [{"path": "thesis.txt"}]}


@pytest.fixture
def sources(tmp_path: Path) -> list[Path]:
    (tmp_path / "src").mkdir()
    return _sources(tmp_path / "src")


def _s3(url: str) -> str:
    return url.removeprefix("s3://")


# -- local targets ------------------------------------------------------------------------
def test_a_forged_manifest_is_refused_and_nothing_is_deleted(tmp_path: Path,
                                                             sources: list[Path],
                                                             fmt: str) -> None:
    forged = tmp_path / "forged"
    forged.mkdir()
    (forged / "thesis.txt").write_text("thesis\n")
    (forged / "windowkit.json").write_text(json.dumps(FORGED))
    before = _snapshot(forged)
    result = _cli_convert(sources, forged, fmt, "--overwrite")
    _one_line_error(result, str(forged), "windowkit.json does not open as one",
                    "nothing was changed")
    assert _snapshot(forged) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["forged", "src"]


def test_a_valid_manifest_listing_a_users_file_does_not_delete_it(
        tmp_path: Path, sources: list[Path], fmt: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A real store's manifest edited to list the user's file (a digest the file
    does not have): the old store is replaced, the user's file kept and named."""
    store = _convert(sources, tmp_path / "store", fmt)
    thesis = store.path / "thesis.txt"
    thesis.write_text("three years of work")
    manifest = json.loads((store.path / "windowkit.json").read_text())
    manifest["files"].append({"path": "thesis.txt", "bytes": thesis.stat().st_size,
                              "sha256": "0" * 64})
    (store.path / "windowkit.json").write_text(json.dumps(manifest))
    wk.open_store(store.path)  # it opens: the same rules as --overwrite's
    with caplog.at_level(logging.WARNING, logger="windowkit"):
        result = _cli_convert(sources[:2], store.path, fmt, "--overwrite")
    assert result.exit_code == 0, result.output
    assert "kept 'thesis.txt' of the replaced store" in caplog.text
    [retired] = tmp_path.glob(".store.windowkit-old-*")
    assert sorted(p.name for p in retired.iterdir()) == ["thesis.txt"]
    assert (retired / "thesis.txt").read_text() == "three years of work"
    assert wk.open_store(store.path).manifest.series["count"] == 2


def test_a_listed_file_the_user_changed_is_kept(tmp_path: Path, sources: list[Path],
                                                fmt: str, caplog: pytest.LogCaptureFixture
                                                ) -> None:
    """Changed size: refused before anything is touched. Same size, other bytes
    (seen only by its SHA-256, at deletion): kept and named in a warning."""
    store = _convert(sources, tmp_path / "store", fmt)
    series = store.path / "series.parquet"
    original = series.read_bytes()
    series.write_bytes(original + b"mine")
    before = _snapshot(store.path)
    _one_line_error(_cli_convert(sources, store.path, fmt, "--overwrite"),
                    "'series.parquet' was changed since windowkit wrote it",
                    "nothing was changed")
    assert _snapshot(store.path) == before
    edited = bytes([original[0] ^ 1]) + original[1:]
    series.write_bytes(edited)
    with caplog.at_level(logging.WARNING, logger="windowkit"):
        result = _cli_convert(sources[:2], store.path, fmt, "--overwrite")
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
    before = _snapshot(tmp_path)
    for extra in ((), ("--overwrite",)):
        result = CliRunner().invoke(main, ["convert", *map(str, sources), "--format", "zarr",
                                           "--out", out, "--window", "8", "-q", *extra])
        _one_line_error(result, "is the current directory or holds it")
    assert _snapshot(tmp_path) == before  # no workspace, inside or beside


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
        return dataclasses.replace(real(*args, **kwargs), step_shape=(1,) * 9)

    monkeypatch.setattr(_pipeline, "finalize", finalize)


def test_a_manifest_that_would_not_open_is_not_published(
        tmp_path: Path, sources: list[Path], fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    old = _convert(sources, tmp_path / "store", fmt)
    before = _snapshot(old.path)
    _unopenable(monkeypatch)
    with pytest.raises(wk.StoreError, match=r"step_shape.*nothing was published"):
        _convert(sources[:2], tmp_path / "store", fmt, overwrite=True)
    with pytest.raises(wk.StoreError, match="nothing was published"):
        _convert(sources, tmp_path / "new", fmt)
    assert _snapshot(old.path) == before
    assert not os.path.lexists(tmp_path / "new")


# -- object storage -----------------------------------------------------------------------
def test_a_forged_remote_manifest_is_refused_and_nothing_is_deleted(
        s3_bucket: str, mirror_cache: Path) -> None:  # noqa: F811
    url = f"{s3_bucket}/forged"
    fs = fsspec.filesystem("s3")
    fs.pipe(f"{_s3(url)}/thesis.txt", b"thesis\n")
    fs.pipe(f"{_s3(url)}/windowkit.json", json.dumps(FORGED).encode())
    npy = mirror_cache.parent / "s0.npy"
    np.save(npy, np.arange(600, dtype=np.float32).reshape(200, 3))
    result = CliRunner().invoke(main, ["convert", str(npy), "--format", "zarr", "--window",
                                       "32", "--overwrite", "--out", url, "-q"])
    _one_line_error(result, "windowkit.json does not open as one", "nothing was changed")
    assert sorted(fs.find(_s3(s3_bucket))) == [f"{_s3(url)}/thesis.txt",
                                               f"{_s3(url)}/windowkit.json"]
    assert fs.cat(f"{_s3(url)}/thesis.txt") == b"thesis\n"


def test_a_remote_object_the_user_changed_is_refused(s3_bucket: str, fmt: str,
                                                     mirror_cache: Path) -> None:  # noqa: F811
    url = f"{s3_bucket}/s"
    series = _series([300, 200])
    wk.convert(series, url, format=fmt, window=8, block_rows=64)
    fs = fsspec.filesystem("s3")
    key = f"{_s3(url)}/series.parquet"
    original = fs.cat(key)
    for changed in (original + b"x", bytes([original[0] ^ 1]) + original[1:]):
        fs.pipe(key, changed)
        before = {name: fs.cat(name) for name in fs.find(_s3(s3_bucket))}
        with pytest.raises(wk.StoreExistsError, match=r"'series\.parquet' was changed since"):
            wk.convert(series[:1], url, format=fmt, window=8, overwrite=True)
        assert {name: fs.cat(name) for name in fs.find(_s3(s3_bucket))} == before
    fs.pipe(key, original)
    store = wk.convert(series[:1], url, format=fmt, window=8, overwrite=True)
    assert store.manifest.series["count"] == 1


@pytest.mark.parametrize("root", ["", "/"])
def test_a_bucket_root_is_refused_in_one_line(s3_bucket: str, mirror_cache: Path,  # noqa: F811
                                              root: str) -> None:
    npy = mirror_cache.parent / "s0.npy"
    np.save(npy, np.arange(300, dtype=np.float32).reshape(100, 3))
    result = CliRunner().invoke(main, ["convert", str(npy), "--format", "zarr", "--window",
                                       "8", "--out", s3_bucket + root, "-q"])
    _one_line_error(result, "is a bucket root", "/store")
    assert fsspec.filesystem("s3").find(_s3(s3_bucket)) == []
    assert not list(mirror_cache.glob("remote/*/*"))


def test_a_remote_manifest_that_would_not_open_is_not_published(
        s3_bucket: str, mirror_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    url = f"{s3_bucket}/s"
    _unopenable(monkeypatch)
    with pytest.raises(wk.StoreError, match="nothing was published"):
        wk.convert(_series([200]), url, format="parquet", window=8)
    assert not fsspec.filesystem("s3").exists(f"{_s3(url)}/windowkit.json")


def test_a_remote_store_being_replaced_says_so_then_opens_as_the_new_one(
        s3_bucket: str, fmt: str, mirror_cache: Path,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Paused just before the new manifest is written: opening names the
    replacement (never "corrupt"); after it, the new store reads its windows,
    and the old store's objects the new one lacks are gone."""
    url = f"{s3_bucket}/s"
    old, new = _series([300, 200]), _series([250], seed=1)
    wk.convert(old, url, format=fmt, window=8, block_rows=64)
    commit = _remote.commit
    seen: list[str] = []

    def paused_commit(*args: Any) -> None:
        with pytest.raises(wk.StoreError) as opened:
            wk.open_store(url)
        seen.append(str(opened.value))
        commit(*args)

    monkeypatch.setattr(_remote, "commit", paused_commit)
    store = wk.convert(new, url, format=fmt, window=8, block_rows=64, overwrite=True)
    assert len(seen) == 1 and "being replaced" in seen[0], seen
    expected = oracle_windows(new, wk.WindowSpec(8))[0]
    np.testing.assert_array_equal(store.windows("train", np.arange(len(expected))), expected)
    listed = {f"{_s3(url)}/{e.path}" for e in store.manifest.files} | {
        f"{_s3(url)}/windowkit.json"}
    assert set(fsspec.filesystem("s3").find(_s3(s3_bucket))) == listed


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
                                                      mirror_cache: Path) -> None:  # noqa: F811
    url = f"{s3_bucket}/s"
    lock = _plant_stale_lock(url)
    series = _series([200])
    store = wk.convert(series, url, format="zarr", window=SPEC)
    assert store.num_windows("train") == len(oracle_windows(series, SPEC)[0])
    fsspec.filesystem("s3").invalidate_cache()
    assert not fsspec.filesystem("s3").exists(lock)
