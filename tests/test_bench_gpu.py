"""``make bench-gpu`` on a machine without a GPU: one line saying it skipped,
exit status 0, and nothing built."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.benchmarks import gpu

ROOT = Path(__file__).resolve().parent.parent


def test_without_a_gpu_it_says_so_and_exits_0(tmp_path: Path) -> None:
    if any(gpu.gpu_present()):
        pytest.skip("a GPU is present: make bench-gpu would run in full")
    out = tmp_path / "bench-out"
    env = {**os.environ, "WINDOWKIT_BENCH_DIR": str(out)}
    proc = subprocess.run([sys.executable, "-m", "tests.benchmarks.gpu"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines() == [gpu.SKIPPED]
    assert not out.exists()  # no store was built, no figures saved
