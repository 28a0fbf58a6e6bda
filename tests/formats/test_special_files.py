"""A store file replaced by a FIFO or a directory: one windowkit error line
naming the file, from every format and reader, and a problem line from
``verify``; never a read that waits forever for a FIFO's writer.

Each case runs under a watchdog: should a read block on a FIFO, the watchdog
opens the FIFO for writing after a while (the blocked read then ends) and the
test fails, instead of hanging the suite (pytest-timeout is the last resort)."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

import windowkit as wk
from tests.conftest import collect_epoch
from tests.helpers import random_series
from windowkit.cli import main
from windowkit.errors import carried_error
from windowkit.formats._checks import check_regular, read_file
from windowkit.location import open_parquet, read_ranges
from windowkit.manifest import file_digest
from windowkit.verify import verify_store

pytestmark = pytest.mark.timeout(240)

WATCHDOG_SECONDS = 20.0  # a read still waiting on a FIFO then is a hang

#: Every file of a store of each format that a reader opens (one Zarr chunk stands
#: for all; the TFRecord part is the store's one part).
STORE_FILES = {
    "zarr": ["windowkit.json", "series.parquet", "index/train.parquet", "blocks.xxh3",
             "data/zarr.json", "data/c/1/0"],
    "parquet": ["windowkit.json", "series.parquet", "index/train.parquet",
                "blocks.xxh3", "data/part-00000.parquet"],
    "tfrecord": ["windowkit.json", "series.parquet", "index/train.parquet",
                 "blocks.xxh3", "data/records.parquet",
                 "data/part-00000-of-00001.tfrecord"],
}
CASES = [(fmt, name) for fmt, names in STORE_FILES.items() for name in names]
KINDS = {"fifo": "a FIFO", "directory": "a directory"}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A small store of each format (by format name)."""
    base = tmp_path_factory.mktemp("pristine")
    return {fmt: wk.convert(random_series([300, 200]), base / fmt, format=fmt, window=8,
                            block_rows=64).path for fmt in STORE_FILES}


def _copy(pristine: dict[str, Path], tmp_path: Path, fmt: str) -> Path:
    root = tmp_path / fmt
    shutil.copytree(pristine[fmt], root)
    return root


def _replace(path: Path, kind: str) -> None:
    """``path`` (a file) replaced by an empty FIFO or directory."""
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()


@contextlib.contextmanager
def no_hang(root: Path) -> Iterator[None]:
    """Fail if a read under ``root`` blocks on a FIFO: after ``WATCHDOG_SECONDS``,
    every FIFO there is opened for writing (and closed) until the block ends,
    which ends a read waiting on one."""
    done, fired = threading.Event(), threading.Event()

    def unblock() -> None:
        if done.wait(WATCHDOG_SECONDS):
            return
        fired.set()
        while not done.wait(0.2):
            for fifo in (p for p in root.rglob("*") if p.is_fifo()):
                with contextlib.suppress(OSError):  # ENXIO: nobody reads it
                    os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))

    watchdog = threading.Thread(target=unblock, daemon=True)
    watchdog.start()
    try:
        yield
    finally:
        done.set()
        watchdog.join()
        if fired.is_set():  # whatever the read then said
            raise AssertionError(f"a read under {root} blocked on a FIFO")


def _error_of(read: Callable[[], Any]) -> wk.WindowkitError:
    """The one windowkit error ``read`` raises (through TensorFlow: the one it carries)."""
    try:
        read()
    except Exception as exc:  # sorted out right here
        carried = carried_error(exc)
        assert carried is not None, f"not a windowkit error: {type(exc).__name__}: {exc}"
        assert "\n" not in str(carried), str(carried)
        return carried
    raise AssertionError("read a store with a FIFO or a directory in place of a file")


def _expect(error: wk.WindowkitError, path: Path, kind: str) -> None:
    assert isinstance(error, wk.StoreError), repr(error)
    assert f"{path}: is not a regular file ({KINDS[kind]})" in str(error), str(error)


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize(("fmt", "name"), CASES)
def test_opening_the_store_refuses_it(pristine: dict[str, Path], tmp_path: Path, fmt: str,
                                      name: str, kind: str) -> None:
    """Found at open (the manifest's files are checked there) and by ``verify``."""
    root = _copy(pristine, tmp_path, fmt)
    _replace(root / name, kind)
    with no_hang(root):
        error = _error_of(lambda: wk.open_store(root))
        problems = verify_store(root)
    assert str(error) == f"{root / name}: is not a regular file ({KINDS[kind]})"
    assert problems == [str(error)]


def _windows(store: wk.Store) -> Any:
    return store.windows("train", np.arange(store.num_windows("train")))


def _keras(store: wk.Store) -> Any:
    dataset = store.keras_dataset("train", 64, shuffle=False)
    return [dataset[i] for i in range(len(dataset))]


def _tf(store: wk.Store) -> Any:
    """One epoch of ``tf_dataset``, its groups read by the format's row reader."""
    import windowkit.readers.tf as tf_reader

    original = tf_reader.split_dataset
    tf_reader.split_dataset = functools.partial(original, graph_reads=False)  # type: ignore[assignment]
    try:
        return collect_epoch(store.tf_dataset("train", 64, shuffle=False))
    finally:
        tf_reader.split_dataset = original  # type: ignore[assignment]


def _torch(store: wk.Store) -> Any:
    return list(store.torch_dataset("train", 64, shuffle=False))


READERS = {"windows": _windows, "keras": _keras, "tf": _tf, "torch": _torch}


@pytest.mark.parametrize(("fmt", "name"), CASES)
def test_every_reader_refuses_a_file_replaced_after_opening(
        pristine: dict[str, Path], tmp_path: Path, fmt: str, name: str) -> None:
    """The store opened while the file was one, then the file replaced by a FIFO
    (each reader on a store handle of its own, nothing read yet), then by a
    directory: one line naming the file (the manifest: the store was replaced)."""
    root = _copy(pristine, tmp_path, fmt)
    for kind in KINDS:
        if not (root / name).is_file():  # the FIFO of the round before
            (root / name).unlink()
            shutil.copyfile(pristine[fmt] / name, root / name)
        readers = {what: (read, wk.open_store(root)) for what, read in READERS.items()
                   if kind == "fifo" or what == "windows"}
        _replace(root / name, kind)
        with no_hang(root):
            for what, (read, store) in readers.items():
                error = _error_of(functools.partial(read, store))
                if name == "windowkit.json":
                    assert isinstance(error, wk.StoreReplacedError), (what, repr(error))
                    assert str(error).startswith(f"{root}: "), (what, str(error))
                else:
                    _expect(error, root / name, kind)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_verify_says_a_problem_line(pristine: dict[str, Path], tmp_path: Path,
                                    kind: str) -> None:
    """``windowkit verify``: exit 1 and the problem, one line; ``inspect`` refuses."""
    root = _copy(pristine, tmp_path, "zarr")
    chunk = root / "data/c/1/0"
    _replace(chunk, kind)
    with no_hang(root):
        result = CliRunner().invoke(main, ["verify", "-q", str(root)])
        inspected = CliRunner().invoke(main, ["inspect", str(root)])
    assert result.exit_code == 1, result.output
    assert result.output == (f"windowkit: verify: {chunk}: is not a regular file "
                             f"({KINDS[kind]})\n")
    assert inspected.exit_code == 2 and inspected.output.count("\n") == 1, inspected.output


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_opening_helpers_never_block(pristine: dict[str, Path], tmp_path: Path,
                                         kind: str) -> None:
    """Each way windowkit opens a store file, called on a FIFO (or a directory)
    directly, as when one is swapped in after the checks: one line, no wait."""
    root = _copy(pristine, tmp_path, "tfrecord")
    for name in ("blocks.xxh3", "data/part-00000-of-00001.tfrecord",
                 "data/records.parquet"):
        _replace(root / name, kind)
    opens: list[tuple[Path, Callable[[Path], object]]] = [
        (root / "blocks.xxh3", lambda p: read_file(p, 1 << 20)),
        (root / "data/part-00000-of-00001.tfrecord", lambda p: read_ranges([p], [0], [16])),
        (root / "data/records.parquet", open_parquet),
        (root / "data/records.parquet", check_regular),
        (root / "blocks.xxh3", file_digest),
    ]
    with no_hang(root):
        for path, opener in opens:
            _expect(_error_of(functools.partial(opener, path)), path, kind)
