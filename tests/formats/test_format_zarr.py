"""Zarr stores: the format contracts (tests/format_contract.py,
tests/hostile_contract.py), and what only Zarr promises about its chunks: a
decompression bomb is one error with bounded memory, a failed chunk write no
task noise."""

from __future__ import annotations

import struct
import subprocess
import sys
import zlib
from pathlib import Path

import google_crc32c
import numpy as np
import pytest

import windowkit as wk
from tests.format_contract import FormatTests
from tests.hostile_contract import BLOCK_SPEC, HostileStoreTests, expect_errors


def _zstd_rle_bomb(size: int) -> bytes:
    """A zstd frame of ``size`` zero bytes made of RLE blocks (~4 bytes per 128 KiB)."""
    block = 128 << 10
    out = bytearray(b"\x28\xb5\x2f\xfd" + bytes([0xE0]) + struct.pack("<Q", size))
    left = size
    while left:
        n = min(block, left)
        left -= n
        out += struct.pack("<I", (n << 3) | (1 << 1) | (left == 0))[:3] + b"\0"
    return bytes(out)


def _gzip_bomb(size: int) -> bytes:
    deflate = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(1 << 20)
    return b"".join([deflate.compress(zeros) for _ in range(size >> 20)] + [deflate.flush()])


def _peak_growth_mb(path: Path) -> tuple[int, str]:
    """Peak RSS growth (MB) of a fresh process reading every window of ``path``."""
    code = (
        "import resource, sys, numpy as np, windowkit as wk\n"
        "s = wk.open_store(sys.argv[1]); n = s.num_windows('train')\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "try:\n    s.windows('train', np.arange(n)); print('no error')\n"
        "except wk.StoreError as exc:\n    print(exc)\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)\n")
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                          text=True, timeout=120, check=True)
    message, growth = done.stdout.strip().splitlines()[-2:]
    return int(growth), message


@pytest.mark.parametrize("compression", ["zstd", "gzip"])
def test_a_zarr_chunk_bomb_is_one_line_with_bounded_memory(tmp_path: Path,
                                                          compression: str) -> None:
    rows = np.random.default_rng(1).normal(size=(20000, 3)).astype(np.float32)
    path = wk.convert([rows], tmp_path / "s", format="zarr", window=BLOCK_SPEC, block_rows=8192,
                      compression=compression).path  # chunks of 96 KiB
    payload = _zstd_rle_bomb(1 << 30) if compression == "zstd" else _gzip_bomb(96 << 20)
    chunk = path / "data/c/1/0"
    chunk.write_bytes(payload + struct.pack("<I", google_crc32c.value(payload)))
    growth, message = _peak_growth_mb(path)
    assert "cannot decode Zarr chunk" in message and str(chunk) in message, message
    assert growth < 64, growth
    expect_errors(path, lambda _: None, "cannot decode Zarr chunk")


ENOSPC_SCRIPT = """
import asyncio, errno, sys, numpy as np
import zarr.storage
original = zarr.storage.LocalStore.set
async def failing_set(self, key, value):
    if key.startswith("c/3/"):
        raise OSError(errno.ENOSPC, "No space left on device")
    if key.startswith("c/"):
        await asyncio.sleep(0.3)  # other chunk writes are still pending then
    return await original(self, key, value)
zarr.storage.LocalStore.set = failing_set
import windowkit as wk
try:
    wk.convert([np.zeros((20000, 4), dtype="float32")], sys.argv[1], format="zarr",
               window=8, block_rows=256)
except wk.StoreError as exc:
    print(type(exc).__name__)
"""


def test_a_zarr_write_failing_for_lack_of_space_leaves_no_task_noise(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", ENOSPC_SCRIPT, str(tmp_path / "s")],
                          capture_output=True, text=True, timeout=120, check=True)
    assert "Error" in done.stdout
    assert "Task was destroyed" not in done.stderr, done.stderr[-2000:]


class TestZarr(FormatTests, HostileStoreTests):
    """The format contracts for Zarr stores."""

    format_name = "zarr"
