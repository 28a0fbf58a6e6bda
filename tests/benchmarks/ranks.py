"""Ranks on one host: what two ranks hold and read of a 512 MiB split.

    python -m tests.benchmarks.ranks [--rows-mib 512]

A Zarr store of 8 series x 1,048,576 rows x 16 float32 (512 MiB of rows),
L=32. Two processes read one shuffled epoch of ``torch_dataset("train",
1024, shuffle="global")`` at the same time, as ranks 0 and 1 of 2 (each its
own piece of the split); then, for comparison, two processes each reading
the whole split (what every rank held before ranks owned pieces). Per
process: how much its proportional set size (PSS: shared pages split between
the processes that map them) and its anonymous memory (``RssAnon``: what the
kernel cannot reclaim) grew while reading, and the bytes it read from files
(``read_chars``). The bar: the two ranks' PSS growth, summed, at most 1.3x
the split's rows.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from tests.benchmarks.benchmark import OUT, _save

SERIES, FEATURES, LENGTH, BATCH = 8, 16, 32, 1024


def _memory() -> tuple[float, float]:
    """(PSS, RssAnon) of this process, MB."""
    import psutil

    pss = psutil.Process().memory_full_info().pss / 1e6
    anon = 0.0
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            anon = int(line.split()[1]) * 1024 / 1e6
    return pss, anon


def child(store_path: str, rank: int, world: int) -> dict[str, Any]:
    """One rank's epoch: memory growth and bytes read."""
    import psutil
    import torch

    import windowkit as wk

    store = wk.open_store(store_path)
    io = psutil.Process().io_counters
    pss0, anon0 = _memory()
    read0, start = io().read_chars, time.perf_counter()
    ds = store.torch_dataset("train", BATCH, shuffle="global", seed=0, rank=rank,
                             world_size=world, memory_budget=4 << 30)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, sampler=ds.sampler())
    windows, peak = 0, (0.0, 0.0)
    for x in loader:
        windows += int(x.shape[0])
        if windows % (64 * BATCH) == 0:
            peak = max(peak, _memory())
    peak = max(peak, _memory())
    return {"rank": rank, "world": world, "windows": windows,
            "seconds": time.perf_counter() - start, "pss_mb": peak[0] - pss0,
            "anon_mb": peak[1] - anon0, "read_mb": (io().read_chars - read0) / 1e6}


def _store(rows: int) -> Path:
    import windowkit as wk

    path = OUT / f"ranks-{rows}"
    if not (path / "windowkit.json").exists():
        source = OUT / f"ranks-src-{rows}"
        source.mkdir(parents=True, exist_ok=True)
        for s in range(SERIES):
            file = source / f"s{s}.npy"
            if not file.exists():
                out = np.lib.format.open_memmap(file, mode="w+", dtype=np.float32,
                                                shape=(rows, FEATURES))
                out[:] = np.random.default_rng(s).standard_normal((rows, FEATURES),
                                                                  dtype=np.float32)
                out.flush()
        wk.convert(sorted(source.glob("*.npy")), path, format="zarr", window=LENGTH,
                   splits={"train": 1.0})
    return path


def _run(store: Path, rank: int, world: int) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "tests.benchmarks.ranks", "--child",
                           str(store), str(rank), str(world)], capture_output=True, text=True,
                          check=False, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-3000:])
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows-mib", type=int, default=512)
    parser.add_argument("--child", nargs=3)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), int(args.child[2]))))
        return
    rows = args.rows_mib * 2**20 // (SERIES * FEATURES * 4)
    store = _store(rows)
    rows_mb = SERIES * rows * FEATURES * 4 / 1e6
    results = {}
    for name, world in (("2 ranks, a piece each", 2), ("2 processes, whole split each", 1)):
        ranks = (0, 1) if world == 2 else (0, 0)
        with ThreadPoolExecutor(2) as pool:
            runs = list(pool.map(_run, [store] * 2, ranks, [world] * 2))
        results[name] = runs
    print(f"two processes on one host reading {rows_mb:,.0f} MB of rows (Zarr, L={LENGTH}, "
          f"batch {BATCH}, shuffle='global'): growth while reading one epoch")
    print(f"{'':<32}{'windows':>11}{'PSS MB':>9}{'anon MB':>9}{'read MB':>9}{'s':>7}")
    for name, runs in results.items():
        for r in runs:
            print(f"{name + ' #' + str(runs.index(r)):<32}{r['windows']:>11,}{r['pss_mb']:>9.0f}"
                  f"{r['anon_mb']:>9.0f}{r['read_mb']:>9.0f}{r['seconds']:>7.1f}")
        pss = sum(r["pss_mb"] for r in runs)
        print(f"{'  together':<32}{sum(r['windows'] for r in runs):>11,}{pss:>9.0f}"
              f"{sum(r['anon_mb'] for r in runs):>9.0f}"
              f"{sum(r['read_mb'] for r in runs):>9.0f}   PSS {pss / rows_mb:.2f}x the rows")
    _save("ranks", rows_mb=rows_mb, results=results)


if __name__ == "__main__":
    main()
