"""Stores where users keep them: behind a symlinked directory, checked out by
DVC (``cache.type symlink``: every file an absolute link into a
content-addressed cache) or by git-annex (relative links into
``.git/annex/objects``, read-only), laid out here by hand as those tools lay
them out. Every format reads them window for window as the plain store,
through every reader; ``verify``, ``inspect`` and ``bench`` exit 0;
``--overwrite`` replaces what windowkit wrote and never touches what a link
leads to. A part swapped for a FIFO, a socket or a directory after
``tf_dataset`` was built is one line, never a hang, in every shuffle mode."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import windowkit as wk
from tests.conftest import collect_epoch
from tests.helpers import numbered_series
from windowkit.cli import main
from windowkit.verify import verify_store

FORMATS = ["zarr", "parquet", "tfrecord"]
SPEC = wk.WindowSpec(8, stride=2, horizon=2)
ROOT = Path(__file__).resolve().parents[1]


def _series(shift: float = 0.0) -> list[np.ndarray]:
    return [s.astype(np.float32) + shift for s in numbered_series([400, 250, 90], features=3)]


def _plain(path: Path, fmt: str, shift: float = 0.0) -> wk.Store:
    return wk.convert(_series(shift), path, format=fmt, window=SPEC, block_rows=64)


# -- the layouts ---------------------------------------------------------------------------------
def linked_directory(store: Path, home: Path) -> Path:
    """The store moved to another disk (``home``), a link where it was."""
    real = home / "disk" / "stores" / store.name
    real.parent.mkdir(parents=True)
    shutil.move(store, real)
    store.symlink_to(real, target_is_directory=True)
    return store


def dvc_checkout(store: Path, home: Path) -> Path:
    """Every file an absolute link to ``.dvc/cache/files/md5/xx/rest`` (read-only)."""
    cache = home / ".dvc" / "cache" / "files" / "md5"
    return _content_addressed(store, lambda digest: cache / digest[:2] / digest[2:],
                              relative=False)


def annex_checkout(store: Path, home: Path) -> Path:
    """Every file a relative link to ``.git/annex/objects/xx/yy/KEY/KEY``
    (read-only file and directory)."""
    objects = home / ".git" / "annex" / "objects"

    def where(digest: str) -> Path:
        key = f"SHA256E-s0--{digest}"
        return objects / digest[:2] / digest[2:4] / key / key

    return _content_addressed(store, where, relative=True)


def _content_addressed(store: Path, where: Callable[[str], Path], *, relative: bool) -> Path:
    for path in sorted(p for p in store.rglob("*") if p.is_file()):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        target = where(digest)
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            shutil.move(path, target)
            target.chmod(0o444)
        else:
            path.unlink()
        path.symlink_to(os.path.relpath(target, path.parent) if relative else target)
    return store


LAYOUTS = {"linked directory": linked_directory, "dvc": dvc_checkout, "git-annex": annex_checkout}


def _targets(home: Path) -> dict[str, tuple[bytes, int]]:
    """What the links of a DVC or git-annex checkout under ``home`` lead to:
    each cache file's bytes and mode, by path."""
    return {str(path): (path.read_bytes(), stat.S_IMODE(path.stat().st_mode))
            for cache in (home / ".dvc", home / ".git") if cache.exists()
            for path in sorted(cache.rglob("*")) if path.is_file()}


@pytest.fixture(scope="module", params=FORMATS)
def plain(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
          ) -> tuple[str, dict[str, np.ndarray]]:
    """A format, and what each reader reads from its plain store."""
    fmt = request.param
    store = _plain(tmp_path_factory.mktemp("plain") / "store", fmt)
    return fmt, read_all(store)


def read_all(store: wk.Store) -> dict[str, np.ndarray]:
    """Every window of the train split through each reader (index order)."""
    keras = store.keras_dataset("train", 32, shuffle=False)
    torch_ds = store.torch_dataset("train", 32, shuffle=False)
    return {
        "windows": store.windows("train", np.arange(store.num_windows("train")))[0],
        "tf_dataset": collect_epoch(store.tf_dataset("train", 32, shuffle=False))[0],
        "tf_dataset blocks": np.sort(collect_epoch(store.tf_dataset(
            "train", 32, shuffle="blocks"))[0], axis=0),
        "keras_dataset": np.concatenate([keras[i][0] for i in range(len(keras))]),
        "torch_dataset": np.concatenate([torch_ds[i][0].numpy() for i in range(len(torch_ds))]),
        "grain_batches": np.concatenate([b[0] for b in store.grain_batches(
            "train", 32, shuffle=False)]),
    }


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_linked_store_reads_as_the_plain_one(plain: tuple[str, dict[str, np.ndarray]],
                                               tmp_path: Path, layout: str) -> None:
    fmt, want = plain
    path = LAYOUTS[layout](_plain(tmp_path / "store", fmt).path, tmp_path)
    got = read_all(wk.open_store(path))
    for reader, windows in want.items():
        np.testing.assert_array_equal(got[reader], windows, err_msg=reader)
    assert verify_store(path) == []
    for command in (["verify", str(path)], ["inspect", str(path)],
                    ["bench", str(path), "--batches", "3", "--batch-size", "16"]):
        result = CliRunner().invoke(main, command)
        assert result.exit_code == 0, (command, result.output)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_overwrite_replaces_what_windowkit_wrote_and_no_link_target(
        tmp_path: Path, layout: str, fmt: str) -> None:
    path = LAYOUTS[layout](_plain(tmp_path / "store", fmt).path, tmp_path)
    targets = _targets(tmp_path)
    assert bool(targets) == (layout != "linked directory")
    store = wk.convert(_series(1000.0), path, format=fmt, window=SPEC, block_rows=64,
                       overwrite=True)
    assert _targets(tmp_path) == targets  # no cache file deleted or changed
    if layout == "linked directory":  # the link stays, and leads to the new store
        assert path.is_symlink()
    else:  # the links were removed, never what they led to
        assert not any(p.is_symlink() for p in path.rglob("*"))
    first = store.windows("train", np.arange(1))[0]
    assert first.min() >= 1000.0  # the new rows
    assert verify_store(path) == []
    assert not [p for p in tmp_path.iterdir() if "windowkit-old" in p.name]


def test_a_link_to_a_directory_of_other_files_is_not_overwritten(tmp_path: Path) -> None:
    other = tmp_path / "disk"
    other.mkdir()
    (other / "precious.txt").write_text("keep me")
    (tmp_path / "store").symlink_to(other)
    result = CliRunner().invoke(main, ["convert", str(_npy(tmp_path)), "--out",
                                       str(tmp_path / "store"), "--format", "zarr",
                                       "--window", "8", "--overwrite"])
    assert result.exit_code != 0 and "precious.txt" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert sorted(p.name for p in other.iterdir()) == ["precious.txt"]


def _npy(tmp_path: Path) -> Path:
    path = tmp_path / "source.npy"
    np.save(path, _series()[0])
    return path


# -- a part swapped after the dataset was built ---------------------------------------------------
_SWAPPED = textwrap.dedent("""
    import os, socket, sys, time
    import windowkit as wk
    from windowkit.errors import carried_error
    for line in sys.stdin:  # a store, what its parts become, the shuffle
        path, kind, shuffle = line.split()
        store = wk.open_store(path)
        ds = store.tf_dataset("train", 16,
                              shuffle={"false": False, "true": True}.get(shuffle, shuffle))
        for part in sorted(p for p in (store.path / "data").rglob("*") if p.is_file()):
            os.unlink(part)
            if kind == "fifo":
                os.mkfifo(part)
            elif kind == "socket":  # bound from its directory: a socket's path is short
                os.chdir(part.parent)
                socket.socket(socket.AF_UNIX).bind(part.name)
            else:
                os.mkdir(part)
        began = time.monotonic()
        try:
            for _ in ds:
                pass
            print(kind, shuffle, "read", flush=True)
        except Exception as exc:
            error = carried_error(exc)
            print(kind, shuffle, f"{time.monotonic() - began:.1f}", type(error).__name__,
                  str(error), flush=True)
""")


#: For a FIFO, a socket and a directory, each shuffle mode at least once.
SWAPS = [("fifo", "false"), ("socket", "blocks"), ("directory", "false"),
         ("directory", "blocks"), ("fifo", "true")]


@pytest.fixture(scope="module")
def swapped(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Each format's line for each of :data:`SWAPS`, all read in one new process
    (its start is most of the time), by format."""
    tmp = tmp_path_factory.mktemp("swapped")
    script = tmp / "swap.py"
    script.write_text(_SWAPPED)
    cases = [(fmt, kind, shuffle) for fmt in FORMATS for kind, shuffle in SWAPS]
    asked = "".join(f"{_plain(tmp / f'{fmt}-{kind}-{shuffle}', fmt).path} {kind} {shuffle}\n"
                    for fmt, kind, shuffle in cases)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, input=asked, env={**os.environ, "PYTHONPATH": str(ROOT),
                                                         "TF_CPP_MIN_LOG_LEVEL": "3"})
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and len(lines) == len(cases), (proc.stdout, proc.stderr[-2000:])
    out: dict[str, list[str]] = {fmt: [] for fmt in FORMATS}
    for (fmt, _, _), line in zip(cases, lines, strict=True):
        out[fmt].append(line)
    return out


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_part_swapped_after_the_dataset_was_built_is_one_line(
        swapped: dict[str, list[str]], fmt: str) -> None:
    """For a FIFO, a socket and a directory, each shuffle mode at least once
    (the check is the part's, whatever reads it): one line within 10 s, naming
    the part and what it is."""
    lines = swapped[fmt]
    assert [tuple(line.split(" ", 2)[:2]) for line in lines] == SWAPS, lines
    kinds = {"fifo": "a FIFO", "socket": "a socket", "directory": "a directory"}
    for line in lines:
        kind, shuffle, *outcome = line.split(" ", 4)
        if shuffle == "true" and outcome == ["read"]:
            continue  # a uniform shuffle held the rows before the swap: no part is opened
        seconds, name, message = outcome
        assert float(seconds) < 10 and name == "StoreError", line
        assert f"is not a regular file ({kinds[kind]})" in message, line
