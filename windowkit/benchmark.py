"""Benchmarks behind ``make bench`` and ``make bench-memory``.

Each measurement runs in its own subprocess so that its peak RSS is its own;
readers are measured side by side in one run and reported as ratios, because
shared machines are noisy.

    python -m windowkit.benchmark throughput   # windows/s vs materialized windows
    python -m windowkit.benchmark memory       # 2 GiB .npy: convert and epoch RSS
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

OUT = Path(os.environ.get("WINDOWKIT_BENCH_DIR", "bench-out"))
SERIES, ROWS, FEATURES, LENGTH, BATCH = 20, 20_000, 16, 32, 256


def peak_rss_mb() -> float:
    """This process's peak resident set size (VmHWM) in MB."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")  # pragma: no cover - non-Linux


def _run_child(*args: str) -> dict[str, Any]:
    """Run one measurement in a fresh interpreter; it prints one JSON line."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run([sys.executable, "-m", "windowkit.benchmark", "child", *args],
                          capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"benchmark child {args} failed:\n{proc.stderr[-3000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


# -- measurements (run inside child processes) ----------------------------------------
def _time_batches(ds: Any, batches: int | None) -> tuple[int, float]:
    it = iter(ds)
    for _ in range(5):  # warm-up: pipeline start, caches, autotune
        next(it)
    windows, start = 0, time.perf_counter()
    for i, batch in enumerate(it):
        x = batch[0] if isinstance(batch, tuple) else batch
        windows += int(x.shape[0])
        if batches is not None and i + 1 >= batches:
            break
    return windows, time.perf_counter() - start


def child_convert(source: str, out: str) -> dict[str, Any]:
    import windowkit as wk

    start = time.perf_counter()
    store = wk.convert(source, out, format="zarr", window=LENGTH, overwrite=True)
    seconds = time.perf_counter() - start
    raw = store.manifest.data["raw_bytes"]
    return {"convert_mb_s": raw / seconds / 1e6, "seconds": seconds,
            "raw_bytes": raw, "peak_rss_mb": peak_rss_mb(),
            "imported_tensorflow": "tensorflow" in sys.modules}


def child_windowkit(store_path: str, batches: str) -> dict[str, Any]:
    import windowkit as wk

    store = wk.open_store(store_path)
    ds = store.tf_dataset("train", BATCH, shuffle=True, seed=0)
    windows, seconds = _time_batches(ds, None if batches == "epoch" else int(batches))
    return {"windows_s": windows / seconds, "windows": windows, "seconds": seconds,
            "peak_rss_mb": peak_rss_mb()}


def child_materialized(source_dir: str, batches: str) -> dict[str, Any]:
    """The plain approach: every window in memory, ``shuffle(10000).batch(B)``."""
    import tensorflow as tf

    windows = np.concatenate([
        np.lib.stride_tricks.sliding_window_view(np.load(p), LENGTH, axis=0).transpose(0, 2, 1)
        for p in sorted(Path(source_dir).glob("*.npy"))])
    ds = tf.data.Dataset.from_tensor_slices(windows).shuffle(10_000, seed=0).batch(BATCH)
    ds = ds.prefetch(tf.data.AUTOTUNE)
    count, seconds = _time_batches(ds, None if batches == "epoch" else int(batches))
    return {"windows_s": count / seconds, "windows": count, "seconds": seconds,
            "peak_rss_mb": peak_rss_mb(), "materialized_bytes": windows.nbytes}


def child_tf_import() -> dict[str, Any]:
    import tensorflow  # noqa: F401

    return {"peak_rss_mb": peak_rss_mb()}


CHILDREN: dict[str, Callable[..., dict[str, Any]]] = {
    "convert": child_convert, "windowkit": child_windowkit,
    "materialized": child_materialized, "tf_import": child_tf_import,
}


# -- drivers ---------------------------------------------------------------------------
def _make_throughput_data(source_dir: Path) -> None:
    if source_dir.exists() and len(list(source_dir.glob("*.npy"))) == SERIES:
        return
    source_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(SERIES):
        walk = np.cumsum(rng.normal(0, 1, size=(ROWS, FEATURES)), axis=0)
        np.save(source_dir / f"series_{i:02d}.npy", walk.astype(np.float32))


def throughput(rounds: int) -> None:
    source_dir, store = OUT / "throughput-src", OUT / "throughput-zarr"
    _make_throughput_data(source_dir)
    conv = _run_child("convert", str(source_dir / "*.npy"), str(store))
    tf_base = _run_child("tf_import")
    results: dict[str, list[dict[str, Any]]] = {"windowkit": [], "materialized": []}
    for _ in range(rounds):  # alternate, so both see the same machine load
        results["materialized"].append(_run_child("materialized", str(source_dir), "epoch"))
        results["windowkit"].append(_run_child("windowkit", str(store), "epoch"))
    best = {k: max(v, key=lambda r: r["windows_s"]) for k, v in results.items()}
    ratio = best["windowkit"]["windows_s"] / best["materialized"]["windows_s"]
    raw = conv["raw_bytes"]
    on_disk = sum(p.stat().st_size for p in (store / "data").rglob("*") if p.is_file())
    print(f"data: {SERIES} series x {ROWS:,} rows x {FEATURES} float32 features "
          f"({raw / 2**20:.0f} MiB raw), window L={LENGTH}, batch {BATCH}, shuffled, "
          f"best of {rounds} full epochs; machine: {os.cpu_count()} cores")
    print(f"{'reader':<44}{'windows/s':>12}{'vs plain':>10}{'peak RSS':>11}")
    rows = [("zarr tf_dataset (windowkit)", best["windowkit"]),
            ("plain: materialized windows, shuffle(10000)", best["materialized"])]
    for name, r in rows:
        rel = r["windows_s"] / best["materialized"]["windows_s"]
        print(f"{name:<44}{r['windows_s']:>12,.0f}{rel:>9.2f}x{r['peak_rss_mb']:>8.0f} MB")
    print(f"tensorflow import alone: peak RSS {tf_base['peak_rss_mb']:.0f} MB; "
          f"materialized windows: {best['materialized']['materialized_bytes'] / 2**20:.0f} MiB")
    print(f"zarr store: {on_disk / raw:.2f}x raw on disk; convert {conv['convert_mb_s']:.0f} MB/s "
          f"(peak RSS {conv['peak_rss_mb']:.0f} MB)")
    print(f"ratio windowkit / plain: {ratio:.2f}")


def memory(gib: float) -> None:
    source = OUT / "memory-src.npy"
    store = OUT / "memory-zarr"
    rows = int(gib * 2**30) // (FEATURES * 4)
    if not source.exists() or source.stat().st_size < rows * FEATURES * 4:
        OUT.mkdir(parents=True, exist_ok=True)
        out = np.lib.format.open_memmap(source, mode="w+", dtype=np.float32,
                                        shape=(rows, FEATURES))
        rng = np.random.default_rng(0)
        step = 1 << 20
        for lo in range(0, rows, step):
            n = min(step, rows - lo)
            out[lo:lo + n] = rng.standard_normal((n, FEATURES), dtype=np.float32)
        out.flush()
        del out
    size_gib = source.stat().st_size / 2**30
    conv = _run_child("convert", str(source), str(store))
    epoch = _run_child("windowkit", str(store), "epoch")
    base = _run_child("tf_import")
    print(f"source: {size_gib:.2f} GiB float32 .npy, {rows:,} rows x {FEATURES} features")
    print(f"convert: {conv['seconds']:.0f} s, {conv['convert_mb_s']:.0f} MB/s, "
          f"peak RSS {conv['peak_rss_mb']:.0f} MB (bar: < 600 MB; "
          f"tensorflow imported: {conv['imported_tensorflow']})")
    print(f"full shuffled epoch: {epoch['windows']:,} windows in {epoch['seconds']:.0f} s "
          f"({epoch['windows_s']:,.0f} windows/s), peak RSS {epoch['peak_rss_mb']:.0f} MB "
          f"(bar: < 800 MB; tensorflow import alone: {base['peak_rss_mb']:.0f} MB)")
    if os.environ.get("WINDOWKIT_BENCH_KEEP") != "1":
        shutil.rmtree(store, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m windowkit.benchmark")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("throughput")
    p.add_argument("--rounds", type=int, default=2)
    p = sub.add_parser("memory")
    p.add_argument("--gib", type=float, default=2.0)
    p = sub.add_parser("child")
    p.add_argument("name", choices=sorted(CHILDREN))
    p.add_argument("args", nargs="*")
    args = parser.parse_args(argv)
    if args.command == "throughput":
        throughput(args.rounds)
    elif args.command == "memory":
        memory(args.gib)
    else:
        print(json.dumps(CHILDREN[args.name](*args.args)))


if __name__ == "__main__":
    main()
