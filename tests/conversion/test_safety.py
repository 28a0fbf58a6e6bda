"""Safe conversion and verification, for every format: locking, disk-space checks,
resuming byte-identically after an interruption or a kill -9, ``verify`` and
readers that refuse damaged files."""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import windowkit as wk
from tests.helpers import (
    convert_sources,
    file_tree,
    interrupted_convert,
    leftovers,
)
from windowkit.cli import main
from windowkit.conversion import Workspace
from windowkit.verify import verify_store


@pytest.fixture
def reference(tmp_path: Path, sources: list[Path], concept_format: str) -> dict[str, bytes]:
    """Every file of an uninterrupted conversion."""
    return file_tree(convert_sources(sources, tmp_path / "reference", concept_format).path)


def test_changed_options_start_over(tmp_path: Path, sources: list[Path], concept_format: str,
                                    monkeypatch: pytest.MonkeyPatch,
                                    caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "store"
    interrupted_convert(monkeypatch, sources, out, concept_format, parts_done=2)
    with caplog.at_level(logging.INFO, logger="windowkit"):
        store = convert_sources(sources, out, concept_format, block_rows=256)
    assert "the sources or options changed since the interrupted conversion; starting over" \
        in caplog.text
    fresh = convert_sources(sources, tmp_path / "fresh", concept_format, block_rows=256)
    assert file_tree(store.path) == file_tree(fresh.path)


def test_a_second_convert_to_the_same_target_fails_fast(tmp_path: Path, sources: list[Path],
                                                        concept_format: str) -> None:
    out = tmp_path / "store"
    running = Workspace(out)
    running.lock()
    try:
        started = time.perf_counter()
        with pytest.raises(wk.StoreError, match="another windowkit convert is writing this"):
            convert_sources(sources, out, concept_format)
        assert time.perf_counter() - started < 5
    finally:
        running.release()
    convert_sources(sources, out, concept_format)  # the lock is gone with its holder
    assert verify_store(out) == []


def test_not_enough_disk_space_is_refused_before_writing(
        tmp_path: Path, sources: list[Path], concept_format: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 1000, 1000))
    result = CliRunner().invoke(main, ["convert", *map(str, sources), "--format", concept_format,
                                       "--out", str(tmp_path / "store"), "--window", "8", "-q"])
    assert result.exit_code == 2
    assert re.search(r"not enough disk space for the store: it needs about 1\.\d MiB, "
                     r"1000 Bytes are free", result.output), result.output
    assert result.output.count("\n") == 1
    assert leftovers(tmp_path) == [] and not (tmp_path / "store").exists()


# -- kill -9 ------------------------------------------------------------------------------
# The child converts; its part writer sleeps a little per part (``PART_DELAY``), so
# that the test can kill it after a chosen number of parts are finished (it polls
# the workspace's resume markers), never while it imports.
_CHILD = """
import os, sys, time
import numpy as np
import windowkit as wk
from windowkit.formats import get_format

fmt, out, kind = sys.argv[1], sys.argv[2], sys.argv[3]
storage = type(get_format(fmt))
original = storage.write_part
def slow_write_part(self, *args):
    time.sleep(float(os.environ.get("PART_DELAY", "0")))
    return original(self, *args)
storage.write_part = slow_write_part
if kind == "files":
    source = sys.argv[4].split(",")
    options = dict(window=wk.WindowSpec(8, horizon=2), block_rows=128, parts=6)
else:  # an in-memory array of 4M rows, all zeros or all ones
    source = {"a": np.full(4_000_000, 1 if kind == "ones" else 0, dtype=np.float32)}
    options = dict(window=wk.WindowSpec(8), parts=24)
wk.convert(source, out, format=fmt, **options)
"""


def _spawn(fmt: str, out: Path, kind: str, *args: str, delay: float = 0.0
           ) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PART_DELAY": str(delay)}
    return subprocess.Popen([sys.executable, "-c", _CHILD, fmt, str(out), kind, *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)


def _finished_parts(out: Path) -> int:
    resume = out.parent / f".{out.name}.windowkit-partial" / "_resume"
    return len(list(resume.glob("shard-*.json")))


def _kill_after(proc: subprocess.Popen[bytes], out: Path, parts: int) -> int:
    """SIGKILL the child once ``parts`` parts are finished; return how many were."""
    deadline = time.monotonic() + 120
    while _finished_parts(out) < parts and proc.poll() is None:
        assert time.monotonic() < deadline, "the conversion made no progress"
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return _finished_parts(out)


def test_kill_9_after_finished_parts_then_resume(tmp_path: Path, sources: list[Path],
                                                  concept_format: str,
                                                  reference: dict[str, bytes]) -> None:
    """Killed after 1..5 of 6 parts, re-running the same command completes the
    conversion byte-identically and leaves nothing else behind."""
    files = ",".join(map(str, sources))
    for trial, parts in enumerate([1, 3, 5]):
        out = tmp_path / f"store{trial}"
        proc = _spawn(concept_format, out, "files", files, delay=0.3)
        done = _kill_after(proc, out, parts)
        assert parts <= done < 6 and not out.exists(), "the kill landed too late"
        rerun = _spawn(concept_format, out, "files", files)
        assert rerun.wait() == 0, rerun.stderr.read().decode()[-2000:] if rerun.stderr else ""
        assert file_tree(out) == reference
        assert verify_store(out) == []
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_kill_9_then_converting_other_arrays_never_mixes_them(tmp_path: Path,
                                                              concept_format: str) -> None:
    """An interrupted conversion of zeros, then a conversion of ones to the same
    target: the store holds ones only (arrays are identified by their content)."""
    out = tmp_path / "store"
    done = _kill_after(_spawn(concept_format, out, "zeros", delay=0.2), out, 3)
    assert 3 <= done < 24 and not out.exists(), "the kill landed too late"
    assert _spawn(concept_format, out, "ones").wait() == 0
    store = wk.open_store(out)
    rng = np.random.default_rng(0)
    sample = rng.choice(store.num_windows("train"), 20_000, replace=False)
    assert (store.windows("train", np.sort(sample)) == 1).all()
    assert verify_store(out) == []


@pytest.mark.slow
def test_kill_9_at_random_moments_soak(tmp_path: Path, sources: list[Path], concept_format: str,
                                       reference: dict[str, bytes]) -> None:
    """Killed at 16 random moments of a conversion (while it writes parts, index
    tables, the manifest or publishes), the same command always completes it
    byte-identically; a kill after the rename leaves a complete store."""
    files = ",".join(map(str, sources))
    started = time.perf_counter()
    assert _spawn(concept_format, tmp_path / "timing", "files", files, delay=0.05).wait() == 0
    duration = time.perf_counter() - started
    rng = np.random.default_rng(11)
    for trial in range(16):
        out = tmp_path / f"store{trial}"
        proc = _spawn(concept_format, out, "files", files, delay=0.05)
        time.sleep(duration * rng.uniform(0.3, 1.1))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if not out.exists():
            assert _spawn(concept_format, out, "files", files).wait() == 0
        assert file_tree(out) == reference
        assert verify_store(out) == []
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


# -- damaged files: verify names them, readers refuse them ------------------------------


def test_too_little_space_on_resume_keeps_the_finished_parts(
        tmp_path: Path, sources: list[Path], concept_format: str, reference: dict[str, bytes],
        monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "store"
    interrupted_convert(monkeypatch, sources, out, concept_format, parts_done=2)
    usage = namedtuple("usage", "total used free")
    with monkeypatch.context() as patch:
        patch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9, 0))
        with pytest.raises(wk.DiskSpaceError, match="not enough disk space"):
            convert_sources(sources, out, concept_format)
    assert leftovers(tmp_path) == [".store.windowkit-partial"]  # still resumable
    assert file_tree(convert_sources(sources, out, concept_format).path) == reference
