"""A spill that cannot be written (rows beyond ``memory_budget`` go to a private
file in the spill directory) is one windowkit line naming the directory and
what to set: never a bare ``[Errno 27] File too large``, ``[Errno 28] No
space left on device`` or ``[Errno 30] Read-only file system``.

The conditions are real, not mocked: a directory the process may not write to
(for root, which writes anywhere, a read-only bind mount), and a file size limit
(``RLIMIT_FSIZE``, with ``SIGXFSZ`` ignored), under which a write past the
limit fails with ``EFBIG`` as on a file system whose largest file is too small.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import windowkit as wk

TINY = 4096  # bytes of memory_budget: every test store's rows are spilled
LIMIT = 64 << 10  # the file size limit of the child: below the store's rows (320 KB)

#: the child: opens the store, limits the size of the files it writes, then reads
#: with each reader that spills and prints each error's type and message
_CHILD = """
import resource, signal, sys
import windowkit as wk

store, spill, reader = wk.open_store(sys.argv[1]), sys.argv[2], sys.argv[3]
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit: EFBIG
if int(sys.argv[4]):  # bytes a file may hold (0: no limit)
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[4]), resource.RLIM_INFINITY))
try:
    if reader == "grain":
        store.grain_source("train", memory_budget=4096, spill_dir=spill)[0]
    else:
        next(iter(store.tf_dataset("train", 64, shuffle="global", memory_budget=4096,
                                   spill_dir=spill)))
except Exception as exc:
    print(f"{type(exc).__name__}|{exc}")
else:
    print("no error")
"""


@pytest.fixture
def store(tmp_path: Path) -> wk.Store:
    series = [np.arange(40_000 * 2, dtype=np.float32).reshape(-1, 2)]
    return wk.convert(series, tmp_path / "store", format="zarr", window=wk.WindowSpec(4))


@pytest.mark.parametrize("reader", ["grain", "tf"])
def test_a_file_too_large_for_the_spill_is_one_line(store: wk.Store, tmp_path: Path,
                                                   reader: str) -> None:
    if reader == "tf":
        pytest.importorskip("tensorflow")
    spill = tmp_path / "spill"
    spill.mkdir()
    assert store.read_plan("train").rows_bytes() > LIMIT
    _assert_one_line([sys.executable, "-c", _CHILD, str(store.path), str(spill), reader,
                      str(LIMIT)], "DiskSpaceError", f"{spill}: File too large while spilling ")
    assert os.listdir(spill) == []  # the private file went with its process


def _assert_one_line(command: list[str], kind: str, start: str) -> None:
    """``command`` (a child reading the store) printed one line: a ``kind`` error
    starting ``start``, saying what to set, with no raw errno."""
    child = subprocess.run(command, capture_output=True, text=True, timeout=300)
    lines = [line for line in child.stdout.splitlines() if line.strip()]
    assert child.returncode == 0 and len(lines) == 1, (child.stdout, child.stderr[-2000:])
    found, message = lines[0].split("|", 1)
    assert found == kind, lines
    assert message.startswith(start), message
    assert "spill_dir=" in message and "$WINDOWKIT_SPILL_DIR" in message, message
    assert "memory_budget" in message and "Errno" not in message, message


def _read_only(spill: Path, command: list[str]) -> list[str]:
    """``command`` run where ``spill`` may not be written: mode 0o500 for a user,
    a read-only bind mount in a mount namespace of its own for root (skipped
    where there is none)."""
    if os.geteuid() != 0:
        spill.chmod(0o500)
        return command
    if shutil.which("unshare") is None or subprocess.run(
            ["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("root writes to a read-only directory, and no mount namespace")
    mount = (f"mount --bind {shlex.quote(str(spill))} {shlex.quote(str(spill))} && "
             f"mount -o remount,bind,ro {shlex.quote(str(spill))} && exec ")
    return ["unshare", "-m", "sh", "-c", mount + shlex.join(command)]


@pytest.mark.parametrize("reader", ["grain", "tf"])
def test_a_read_only_spill_directory_is_one_line(store: wk.Store, tmp_path: Path,
                                                 reader: str) -> None:
    if reader == "tf":
        pytest.importorskip("tensorflow")
    spill = tmp_path / "read-only"
    spill.mkdir()
    command = _read_only(spill, [sys.executable, "-c", _CHILD, str(store.path), str(spill),
                                 reader, "0"])
    try:
        _assert_one_line(command, "InvalidSpecError", f"{spill}: cannot spill ")
    finally:
        spill.chmod(0o700)


def test_the_spill_directory_from_the_environment_is_named(store: wk.Store,
                                                           tmp_path: Path) -> None:
    """With no ``spill_dir=``, the message names the directory
    ``$WINDOWKIT_SPILL_DIR`` chose."""
    spill = tmp_path / "from-env"
    spill.mkdir()
    env = {**os.environ, "WINDOWKIT_SPILL_DIR": str(spill)}
    child = subprocess.run([sys.executable, "-c", _CHILD.replace(
        'spill_dir=spill', 'spill_dir=None'), str(store.path), "unused", "grain", str(LIMIT)],
        capture_output=True, text=True, timeout=300, env=env)
    assert child.stdout.strip().startswith(f"DiskSpaceError|{spill}: File too large"), (
        child.stdout, child.stderr[-2000:])


def test_a_spill_that_fits_still_reads(store: wk.Store, tmp_path: Path) -> None:
    src = store.grain_source("train", memory_budget=TINY, spill_dir=tmp_path)
    assert src._rows().spilled
    np.testing.assert_array_equal(src[3], np.arange(6, 14, dtype=np.float32).reshape(4, 2))
