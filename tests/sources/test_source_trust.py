"""Sources and conversion processes are not trusted: a source changed during a
conversion is caught before publishing; workers end with the main process;
signals, full disks, memory errors and sources a store cannot hold are one
line each (exit 2, or 128 + the signal), with the finished work kept."""

from __future__ import annotations

import errno
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

import windowkit as wk
from tests.conftest import npy_sources
from tests.helpers import convert_sources, file_tree, long_csv, npy_file, text_file
from windowkit.cli import main
from windowkit.errors import SourceChangedError
from windowkit.formats import get_format
from windowkit.verify import verify_store


def _after_parts(monkeypatch: pytest.MonkeyPatch, fmt: str, parts: int,
                  action: Callable[[], object]) -> None:
    """Run ``action`` once, when the format's part writer starts part number
    ``parts`` + 1 (the test seam: the format's ``write_part``)."""
    storage = type(get_format(fmt))
    original = storage.write_part
    calls = {"n": 0}

    def write_part(self: object, *args: object) -> object:
        if calls["n"] == parts:
            action()
        calls["n"] += 1
        return original(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(storage, "write_part", write_part)


def _workspace(out: Path) -> Path:
    return out.parent / f".{out.name}.windowkit-partial"


def _change(path: Path, how: str) -> Callable[[], None]:
    """An action changing the ``.npy`` file ``path`` the way ``how`` says."""
    def action() -> None:
        before = path.stat()
        if how == "replace":  # a new file renamed over it
            np.save(path.with_name("new.npy"), np.ones(np.load(path).shape, np.float32))
            os.replace(path.with_name("new.npy"), path)
            return
        with open(path, "r+b") as fh:  # rewritten in place, same size
            fh.seek(before.st_size // 2)
            fh.write(b"\x01" * 64)
        if how == "same-time":  # and its modification time put back
            os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    return action


# -- sources pinned ------------------------------------------------------------------------
@pytest.mark.parametrize(("how", "message"), [
    ("in-place", "it was rewritten in place: its modification time changed"),
    ("replace", "it was replaced by another file"),
    ("same-time", "the rows of part 1 read again differ from those written")])
def test_a_source_changed_during_the_conversion_is_never_published(
        tmp_path: Path, concept_format: str, monkeypatch: pytest.MonkeyPatch, how: str,
        message: str) -> None:
    (tmp_path / "src").mkdir()
    sources = npy_sources(tmp_path / "src")
    out = tmp_path / "store"
    with monkeypatch.context() as patch:
        _after_parts(patch, concept_format, 2, _change(sources[0], how))
        with pytest.raises(SourceChangedError) as raised:
            convert_sources(sources, out, concept_format)
    assert str(raised.value).startswith(f"{sources[0]}: the source changed during the "
                                        f"conversion ({message}); nothing was published")
    assert not out.exists() and (_workspace(out) / "_resume").is_dir(), "workspace not kept"
    # the same command: the source as it is now
    store = convert_sources(sources, out, concept_format)
    fresh = convert_sources(sources, tmp_path / "fresh", concept_format)
    assert file_tree(store.path) == file_tree(fresh.path)
    assert verify_store(out) == []


def test_a_table_changed_during_the_conversion_is_one_line(
        tmp_path: Path, concept_format: str, monkeypatch: pytest.MonkeyPatch) -> None:
    table = tmp_path / "t.csv"
    table.write_text(long_csv([("a", t, str(t)) for t in range(600)]
                           + [("b", t, "2.5") for t in range(600)]))
    out = tmp_path / "store"
    _after_parts(monkeypatch, concept_format, 1, lambda: table.write_text(
        table.read_text().replace("2.5", "3.5")))
    result = CliRunner().invoke(main, ["convert", str(table), "--format", concept_format, "--out",
                                       str(out), "--window", "8", "--series-col", "id",
                                       "--time-col", "t", "--block-rows", "64", "-q",
                                       "--parts", "4"])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert f"{table}: the source changed during the conversion" in result.output
    assert not out.exists() and _workspace(out).is_dir()


def test_an_object_rewritten_on_s3_during_the_conversion_is_refused(
        tmp_path: Path, concept_format: str, s3_bucket: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import fsspec

    fs = fsspec.filesystem("s3")
    (tmp_path / "src").mkdir()
    urls = []
    for path in npy_sources(tmp_path / "src"):
        fs.put(str(path), f"{s3_bucket}/{path.name}")
        urls.append(f"{s3_bucket}/{path.name}")
    changed = tmp_path / "src" / "changed.npy"
    np.save(changed, np.ones((3000, 3), np.float32))
    _after_parts(monkeypatch, concept_format, 2, lambda: fs.put(str(changed), urls[0]))
    out = tmp_path / "store"
    with pytest.raises(SourceChangedError, match=f"{urls[0]}: the source changed during the "
                       "conversion \\(it was written again: its ETag changed\\)"):
        wk.convert(urls, out, format=concept_format, window=wk.WindowSpec(8, horizon=2),
                   block_rows=128, parts=6)
    assert not out.exists() and _workspace(out).is_dir()


# -- refused up front: what a store cannot hold ----------------------------------------------
def _parquet_with_empty_id(d: Path) -> Path:
    import pandas as pd

    pd.DataFrame({"id": ["a"] * 12 + [""] * 12, "t": list(range(12)) * 2,
                  "v": np.arange(24.0)}).to_parquet(d / "t.parquet")
    return d / "t.parquet"


def _fifo(name: str) -> Callable[[Path], Path]:
    def make(d: Path) -> Path:
        os.mkfifo(d / name)
        return d / name
    return make


def _device(d: Path) -> Path:
    (d / "zero.npy").symlink_to("/dev/zero")
    return d / "zero.npy"


_ROWS = [("a", t, "1.5") for t in range(12)] + [("b", t, "2.5") for t in range(12)]
_LONG = ["--series-col", "id", "--time-col", "t"]
REFUSED = [  # (make source, options, message)
    (npy_file("nine.npy", np.zeros((50, *[1] * 9), np.float32)), [],
     "nine.npy: rows have 9 dimensions (1, 1, 1, 1, 1, 1, 1, 1, 1); a store holds rows of "
     "at most 8 dimensions"),
    (npy_file("none.npy", np.zeros((100, 0), np.float32)), [],
     "none.npy: rows hold no values (step shape (0,)); each row needs at least one feature"),
    (text_file("t.csv", ",a,b\n" + "".join(f"{i},{i},{i}\n" for i in range(20))), [],
     "t.csv: column 0 (counting from 0) has no name in the header: name it, or choose the "
     "columns to use with --columns"),
    (text_file("t.csv", "a,b,a\n" + "1,2,3\n" * 20), [],
     "t.csv: column name 'a' appears 2 times in the header; column names must be unique"),
    (text_file("t.csv", f"{'x' * 300},b\n" + "1,2\n" * 20), [],
     "t.csv: column 0 has a name of 300 characters, over 256"),
    (text_file("t.csv", long_csv([*_ROWS[:14], ("", 2, "1"), *_ROWS[15:]])), _LONG,
     "t.csv: row 14, series column 'id' is empty; every row needs a series id"),
    (text_file("t.csv", "v,w\n" + "1,2\n" * 20), ["--columns", "v,v"],
     "t.csv: --columns names 'v' more than once; name each column once"),
    (_parquet_with_empty_id, _LONG, "t.parquet: row 12, series column 'id' is empty"),
    (_fifo("pipe.npy"), [], "pipe.npy: is a FIFO (named pipe), not a file; a source must be "
     "a regular file"),
    (_fifo("pipe.csv"), _LONG, "pipe.csv: is a FIFO (named pipe), not a file"),
    (_device, [], "zero.npy: is a character device, not a file"),
    (lambda d: (d / "l.csv").write_bytes(b"caf\xe9,b\n" + b"1,2\n" * 20) and d / "l.csv", [],
     "l.csv: the header is not UTF-8 text (byte 0xe9 in b'caf\\xe9'); windowkit reads UTF-8 "
     "text only: re-encode the file"),
    (lambda d: (d / "l.csv").write_bytes(b"id,t,v\n" + b"".join(
        b"caf\xe9,%d,1\n" % t for t in range(20))) and d / "l.csv", _LONG,
     "l.csv: cannot read the table near row 0 (Invalid UTF8 payload); windowkit reads UTF-8 "
     "text only"),
]


@pytest.mark.parametrize(("make", "options", "message"), REFUSED,
                         ids=[f"{i}-{c[2].split(':')[0]}" for i, c in enumerate(REFUSED)])
def test_what_a_store_cannot_hold_is_refused_before_writing(
        tmp_path: Path, concept_format: str, make: Callable[[Path], Path], options: list[str],
        message: str) -> None:
    (tmp_path / "src").mkdir()
    source = make(tmp_path / "src")
    out = tmp_path / "out" / "store"
    started = time.monotonic()
    result = CliRunner().invoke(main, ["convert", str(source), "--format", concept_format, "--out",
                                       str(out), "--window", "4", *options])
    assert time.monotonic() - started < 30, "it waited on the source"
    assert result.exit_code == 2, result.output
    assert result.output.count("\n") == 1 and "Traceback" not in result.output
    assert message in result.output, result.output
    assert not out.parent.exists(), "something was written"


# -- read errors, full disks and memory: one line, the workspace kept ------------------------
def test_a_fortran_source_truncated_mid_run_is_one_line(
        tmp_path: Path, concept_format: str, monkeypatch: pytest.MonkeyPatch) -> None:
    source = tmp_path / "f.npy"
    np.save(source, np.asfortranarray(np.random.default_rng(0).normal(size=(4000, 3))))
    out = tmp_path / "store"
    _after_parts(monkeypatch, concept_format, 1, lambda: os.truncate(source, 20_000))
    result = CliRunner().invoke(main, ["convert", str(source), "--format", concept_format, "--out",
                                       str(out), "--window", "8", "--block-rows", "256",
                                       "--parts", "4", "-q"])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert f"{source}: cannot read rows" in result.output
    assert "the file changed or was truncated during the conversion" in result.output
    assert not out.exists() and (_workspace(out) / "_resume").is_dir()


def _raise(exc: BaseException) -> Callable[[], None]:
    def action() -> None:
        raise exc
    return action


@pytest.mark.parametrize(("exc", "message"), [
    (MemoryError(), "out of memory while converting (MemoryError); the finished "
     "parts are kept: run the same command again with fewer --workers or a smaller "
     "--part-size"),
    (RuntimeError("can't start new thread"), "out of memory while converting (RuntimeError: "
     "can't start new thread)"),
    (OSError(errno.ENOSPC, "No space left on device"), "No space left on device while "
     "writing part 1; the finished parts are kept: make room and run the same command "
     "again to resume")])
def test_memory_and_space_errors_are_one_line_and_keep_the_parts(
        tmp_path: Path, concept_format: str, monkeypatch: pytest.MonkeyPatch, exc: BaseException,
        message: str) -> None:
    (tmp_path / "src").mkdir()
    sources = npy_sources(tmp_path / "src")
    out = tmp_path / "store"
    _after_parts(monkeypatch, concept_format, 1, _raise(exc))
    result = CliRunner().invoke(main, ["convert", *map(str, sources), "--format", concept_format,
                                       "--out", str(out), "--window", "8", "-q",
                                       "--block-rows", "128", "--parts", "6"])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert message in result.output, result.output
    if isinstance(exc, OSError):  # named: the part's files in the workspace
        assert f"{_workspace(out) / 'data'}" in result.output
    assert len(list((_workspace(out) / "_resume").glob("shard-*.json"))) == 1


def _file_size_limit(limit: int) -> Callable[[], None]:
    def apply() -> None:  # in the child: a write past ``limit`` bytes fails with EFBIG
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def _cli(*args: str, **popen: object) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, "-c", "from windowkit.cli import main; main()",
                           *args], capture_output=True, text=True, env=env, timeout=300,
                          **popen)  # type: ignore[call-overload]


def test_a_file_too_large_names_the_file_and_the_same_command_resumes(
        tmp_path: Path, concept_format: str) -> None:
    source = tmp_path / "big.npy"
    np.save(source, np.random.default_rng(0).normal(size=(200_000, 4)).astype(np.float32))
    out = tmp_path / "store"
    argv = ["convert", str(source), "--format", concept_format, "--out", str(out), "--window", "8",
            "--parts", "2", "-q"]
    failed = _cli(*argv, preexec_fn=_file_size_limit(200 << 10))
    first = failed.stderr.splitlines()[0] if failed.stderr else ""
    assert failed.returncode == 2, failed.stderr[-2000:]
    assert first.startswith(f"windowkit: error: {_workspace(out) / 'data'}"), first
    assert "File too large while writing part 0; the finished parts are kept: make room " \
           "and run the same command again to resume" in first
    assert failed.stderr.count("\n") == 1, failed.stderr  # zarr's threads print nothing after
    assert not out.exists() and _workspace(out).is_dir()
    assert _cli(*argv).returncode == 0
    assert verify_store(out) == []


# -- processes end together ------------------------------------------------------------------
# The child is a file, so that spawned workers import it too: every format's part
# writer sleeps ``PART_DELAY`` before each part, in the workers as in the main process.
_CHILD = """
import os, time
from windowkit.formats import FORMATS, get_format

for name in FORMATS:
    storage = type(get_format(name))
    def slow(self, *args, _original=storage.write_part):
        time.sleep(float(os.environ.get("PART_DELAY", "0")))
        return _original(self, *args)
    storage.write_part = slow
if __name__ == "__main__":
    from windowkit.cli import main
    main()
"""


def _start_workers(tmp_path: Path, fmt: str, *extra: str
                   ) -> tuple[subprocess.Popen[str], list[str], Path]:
    """A ``convert --workers 2`` in a child process, returned once two parts are
    finished (its workers busy with the next ones), with its argv and target."""
    (tmp_path / "src").mkdir(exist_ok=True)
    child = tmp_path / "child.py"
    child.write_text(_CHILD)
    out = tmp_path / "store"
    argv = [sys.executable, str(child), "convert", *map(str, npy_sources(tmp_path / "src")),
            "--format", fmt, "--out", str(out), "--window", "8", "-q", "--workers", "2",
            "--block-rows", "128", "--parts", "12", *extra]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PART_DELAY": "0.5"})
    deadline = time.monotonic() + 120
    while len(list((_workspace(out) / "_resume").glob("shard-*.json"))) < 2:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline, "the conversion made no progress"
        time.sleep(0.01)
    return proc, argv, out


def _wait_gone(processes: list[Any], seconds: float) -> list[int]:
    """The pids of ``processes`` (psutil) still running after ``seconds``."""
    import psutil

    def running(process: psutil.Process) -> bool:
        try:
            return process.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + seconds
    while any(running(p) for p in processes) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p.pid for p in processes if running(p)]


def _snapshot(directory: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in directory.rglob("*")
            if p.is_file()}


def test_kill_9_of_the_main_process_ends_its_workers(tmp_path: Path) -> None:
    import psutil

    proc, _, out = _start_workers(tmp_path, "parquet")
    children = psutil.Process(proc.pid).children(recursive=True)
    assert len(children) >= 2, "no worker processes"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert _wait_gone(children, 5) == [], "workers outlived the main process"
    before = _snapshot(_workspace(out))
    time.sleep(1.2)  # longer than a part's delay: a live worker would write meanwhile
    assert _snapshot(_workspace(out)) == before, "something wrote after the main process died"


@pytest.mark.parametrize(("fmt", "signum", "code"), [
    ("zarr", signal.SIGTERM, 143), ("parquet", signal.SIGTERM, 143),
    ("tfrecord", signal.SIGTERM, 143), ("parquet", signal.SIGINT, 130)])
def test_a_signal_is_one_line_and_the_same_command_resumes(
        tmp_path: Path, fmt: str, signum: int, code: int) -> None:
    import psutil

    proc, argv, out = _start_workers(tmp_path, fmt)
    children = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signum)
    assert proc.wait(timeout=60) == code
    stderr = proc.stderr.read() if proc.stderr else ""
    assert stderr == (f"windowkit: error: the conversion was interrupted "
                      f"({signal.Signals(signum).name}); the finished parts are kept: run "
                      "the same command again to resume it\n")
    assert _wait_gone(children, 5) == []
    assert not out.exists() and len(list((_workspace(out) / "_resume").glob("shard-*"))) >= 2
    again = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert verify_store(out) == []


def test_a_worker_killed_by_the_system_is_one_line(tmp_path: Path) -> None:
    import psutil

    proc, _, out = _start_workers(tmp_path, "tfrecord")
    workers = [p for p in psutil.Process(proc.pid).children()
               if "resource_tracker" not in " ".join(p.cmdline())]
    workers[0].send_signal(signal.SIGKILL)  # as the kernel's out-of-memory killer would
    assert proc.wait(timeout=60) == 2
    stderr = proc.stderr.read() if proc.stderr else ""
    assert stderr.startswith("windowkit: error: a worker process died (killed by the "
                             "system, most likely out of memory)"), stderr
    assert stderr.count("\n") == 1, stderr
    assert _wait_gone(workers, 5) == []
    assert not out.exists() and (_workspace(out) / "_resume").is_dir()


def test_a_file_too_large_while_staging_a_table_is_one_line(tmp_path: Path) -> None:
    table = tmp_path / "t.csv"
    table.write_text("v\n" + "".join(f"{i}.5\n" for i in range(100_000)))
    out = tmp_path / "store"
    failed = _cli("convert", str(table), "--format", "parquet", "--out", str(out),
                  "--window", "8", "-q", preexec_fn=_file_size_limit(200 << 10))
    assert failed.returncode == 2 and failed.stderr.count("\n") == 1, failed.stderr[-2000:]
    assert failed.stderr.startswith(f"windowkit: error: {_workspace(out) / '_staging'}: File "
                                    f"too large while staging the rows of {table}; make room "
                                    "and run the same command again"), failed.stderr
    assert not out.exists()
