"""Uniform shuffling beyond memory, side by side in one run (``make bench``).

A 20-series store of 256 MiB of rows (uncompressed; column 0 of every row
holds its global row number, so a batch says which windows it holds), read
for one epoch, each reading in its own process:

- ``in memory``: ``shuffle="global"`` with a budget that holds the split;
- ``spilled, warm``: ``shuffle="global"`` with ``memory_budget=64 MiB``: the
  rows spilled to local disk, read by random access from the page cache;
- ``spilled, cold``: the same, the spill dropped from the page cache first;
- ``spilled, cold, NumPy``: the same, read by ``EpochBatches.batch_at`` (the
  NumPy batches the Keras, PyTorch and Grain readers use) instead of ``tf.data``;
- ``block groups``: ``shuffle="blocks"`` at the default budget, and at 64 MiB.

Each reports windows/s, peak RSS over the import baseline, whether every
window came exactly once, and distinct series and distinct (series, row
bucket) per batch next to a uniform permutation of the same windows. The same
run measures the local disk's random 4 KiB reads/s from 1 and from 32 threads
(``disk``), for the bar on ``spilled, cold``: at least half the 32-thread rate.

    python -m tests.benchmarks.beyond_memory [--mib 256] [--formats zarr tfrecord]
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from tests.benchmarks.benchmark import OUT, _run_child, _save

SERIES, FEATURES, LENGTH, BATCH = 20, 16, 32, 256
BUDGET = 64 << 20
BUCKET_ROWS = 4096  # the rows of one "row bucket" of a series
DISK_THREADS = (1, 32)  # threads reading the disk at random, side by side
DISK_SECONDS = 3.0  # each disk measurement, at most
DISK_READ = 4096
COLD_BAR = 0.5  # spilled, cold windows/s over the disk's 32-thread reads/s, at least
MODES = ("in memory", "spilled, warm", "spilled, cold", "spilled, cold, NumPy",
         "block groups", "block groups, 64 MiB")
COLD_MODES = ("spilled, cold", "spilled, cold, NumPy")  # held to the disk bar


def make_source(directory: Path, mib: int) -> int:
    """``SERIES`` .npy files of float32 rows, ``mib`` MiB in all, column 0 the
    row's global number (exact in float32 below 2**24 rows); returns rows per series."""
    rows = (mib << 20) // (SERIES * FEATURES * 4)
    if SERIES * rows >= 2**24:
        raise SystemExit("too many rows for float32 row numbers")
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for s in range(SERIES):
        path = directory / f"s{s:02d}.npy"
        if path.exists():
            continue
        out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32,
                                        shape=(rows, FEATURES))
        out[:] = rng.standard_normal((rows, FEATURES), dtype=np.float32)
        out[:, 0] = np.arange(s * rows, (s + 1) * rows, dtype=np.float32)
        out.flush()
        del out
    return rows


def _rss_mb() -> float:
    import psutil

    return float(psutil.Process().memory_info().rss) / 2**20


def _anon_mb() -> float:
    """This process's anonymous resident memory (``RssAnon``: what it cannot
    give back; mapped page cache is ``RssFile``, the kernel's), MB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    return _rss_mb()


class PeakRss:
    """The highest RSS and anonymous memory seen while open, sampled every
    5 ms on a thread."""

    def __init__(self) -> None:
        self.peak_mb, self.peak_anon_mb = _rss_mb(), _anon_mb()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._done.wait(0.005):
            self.peak_mb = max(self.peak_mb, _rss_mb())
            self.peak_anon_mb = max(self.peak_anon_mb, _anon_mb())

    def stop(self) -> float:
        self._done.set()
        self._thread.join()
        self.peak_anon_mb = max(self.peak_anon_mb, _anon_mb())
        return max(self.peak_mb, _rss_mb())


def child_epoch(store_path: str, mode: str) -> dict[str, Any]:
    """One epoch of ``mode`` (one of :data:`MODES`); what it held and mixed."""
    import tensorflow as tf

    import windowkit as wk
    from windowkit.readers import BatchOptions, ShuffleOptions
    from windowkit.readers.epoch.batches import EpochBatches
    from windowkit.readers.tfdata.uniform import uniform_dataset

    tf.constant(0)  # the runtime loaded: the baseline includes it
    store = wk.open_store(store_path)
    baseline, anon_baseline, start = _rss_mb(), _anon_mb(), time.perf_counter()
    watch = PeakRss()
    if mode.startswith("block groups"):
        budget = BUDGET if mode.endswith("MiB") else None  # else the default budget
        ds = store.tf_dataset("train", BATCH, shuffle="blocks", seed=0, memory_budget=budget)
    else:
        plan = store.read_plan("train")
        budget = BUDGET if mode.startswith("spilled") else 4 * plan.rows_bytes()
        batches = EpochBatches(plan, BatchOptions(BATCH),
                               ShuffleOptions("global", memory_budget=budget))
        batches.hold()
        if mode.startswith("spilled, cold"):
            batches.held_rows().evict()
        ds = (uniform_dataset(batches) if not mode.endswith("NumPy") else
              (batches.batch_at(0, i) for i in range(batches.batches_in(0))))
    build = time.perf_counter() - start
    start = time.perf_counter()
    rows = _first_values(ds).astype(np.int64)
    seconds = time.perf_counter() - start
    peak = watch.stop()
    runs = store.runs("train")
    expected = np.sort(runs.global_starts(np.arange(runs.total)))
    return {"windows": len(rows), "seconds": seconds, "windows_s": len(rows) / seconds,
            "build_s": build, "baseline_mb": baseline, "peak_over_mb": peak - baseline,
            "anon_over_mb": watch.peak_anon_mb - anon_baseline,
            "exactly_once": bool(np.array_equal(np.sort(rows), expected)),
            **_mixing(rows, store.series_table.column("row_offset").to_numpy())}


def _first_values(ds: Any) -> np.ndarray:
    """``x[:, 0, 0]`` of every batch, in order: a ``tf.data.Dataset`` drained
    inside a ``tf.function`` (no Python per batch), else a Python loop."""
    import tensorflow as tf

    if not isinstance(ds, tf.data.Dataset):
        return np.concatenate([np.array(x[:, 0, 0]) for x in ds])

    @tf.function
    def drain(ds: tf.data.Dataset) -> tf.Tensor:
        firsts = tf.TensorArray(tf.float32, size=0, dynamic_size=True, infer_shape=False)
        for x in ds:
            firsts = firsts.write(firsts.size(), x[:, 0, 0])
        return firsts.concat()

    return drain(ds).numpy()


def disk_file(mib: int) -> Path:
    """A new file of real (allocated) blocks where a spill goes, twice the
    spill's size (at least 512 MiB): what :func:`disk_reads` reads at random
    (remove it after)."""
    from windowkit.readers.rows.held import spill_directory

    path = spill_directory() / f"windowkit-bench-disk-{os.getpid()}.bin"
    piece = np.random.default_rng(0).integers(0, 255, 16 << 20, dtype=np.uint8).tobytes()
    with open(path, "wb") as out:
        for _ in range((max(2 * mib, 512) << 20) // len(piece)):
            out.write(piece)
        out.flush()
        os.fsync(out.fileno())
    return path


def disk_reads(path: Path, threads: int, seconds: float = DISK_SECONDS) -> float:
    """Random 4 KiB reads/s of ``path`` (dropped from the page cache first) from
    ``threads`` threads with ``os.pread``: 4 KiB-aligned offsets, each page at
    most once (a page read twice would come from the cache), for ``seconds`` or
    until every page is read."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no read-around
        pages = os.fstat(fd).st_size // DISK_READ
        offsets = np.random.default_rng(threads).permutation(pages) * DISK_READ
        parts = [offsets[k::threads].tolist() for k in range(threads)]
        start = time.perf_counter()
        deadline = start + seconds

        def read(part: list[int]) -> int:
            done = 0
            for offset in part:
                if done % 64 == 0 and time.perf_counter() > deadline:
                    break
                os.pread(fd, DISK_READ, offset)
                done += 1
            return done

        with ThreadPoolExecutor(threads) as pool:
            reads = sum(pool.map(read, parts))
        return reads / (time.perf_counter() - start)
    finally:
        os.close(fd)


def _mixing(rows: np.ndarray, offsets: np.ndarray) -> dict[str, float]:
    """Mean distinct series and (series, row bucket) per full batch, and the same
    for a uniform permutation of these windows."""
    def distinct(ids: np.ndarray) -> float:
        full = ids[: len(ids) // BATCH * BATCH].reshape(-1, BATCH)
        return float(np.mean((np.diff(np.sort(full, axis=1), axis=1) != 0).sum(axis=1) + 1))

    def both(starts: np.ndarray) -> tuple[float, float]:
        series = np.searchsorted(offsets, starts, side="right") - 1
        bucket = series * 10**6 + (starts - offsets[series]) // BUCKET_ROWS
        return distinct(series), distinct(bucket)

    got = both(rows)
    uniform = both(rows[np.random.default_rng(1).permutation(len(rows))])
    return {"series": got[0], "buckets": got[1], "uniform_series": uniform[0],
            "uniform_buckets": uniform[1]}


def run(mib: int, formats: list[str]) -> None:
    source = OUT / f"beyond-src-{mib}"
    rows = make_source(source, mib)
    figures: dict[str, Any] = {"mib": mib, "budget_mib": BUDGET >> 20, "series": SERIES,
                               "rows_per_series": rows, "features": FEATURES,
                               "length": LENGTH, "batch": BATCH, "formats": {}}
    print(f"data: {SERIES} series x {rows:,} rows x {FEATURES} float32 ({mib} MiB), "
          f"uncompressed; L={LENGTH}, batch {BATCH}; spilled: memory_budget="
          f"{BUDGET >> 20} MiB")
    print(f"{'store / mode':<28}{'windows/s':>11}{'vs memory':>11}{'build':>8}"
          f"{'peak+':>9}{'anon+':>9}{'once':>6}{'series':>15}{'buckets':>17}")
    disk: dict[str, float] = {}
    cold: dict[str, float] = {}
    for fmt in formats:
        store = OUT / f"beyond-{fmt}-{mib}"
        if not (store / "windowkit.json").exists():
            _run_child("convert_plain", str(source / "*.npy"), str(store), fmt)
        results = {mode: _best(str(store), mode) for mode in MODES}
        if not disk:  # the disk, in the same run as the cold epochs
            disk = _disk(mib)
        figures["formats"][fmt] = results
        for mode in COLD_MODES:
            cold[f"{fmt} {mode}"] = results[mode]["windows_s"] / disk[str(DISK_THREADS[-1])]
        base = results["in memory"]["windows_s"]
        for mode, r in results.items():
            print(f"{fmt + ' ' + mode:<28}{r['windows_s']:>11,.0f}{r['windows_s'] / base:>10.2f}x"
                  f"{r['build_s']:>7.1f}s{r['peak_over_mb']:>6.0f} MB"
                  f"{r['anon_over_mb']:>6.0f} MB{r['exactly_once']!s:>6}"
                  f"{r['series']:>7.1f} of {r['uniform_series']:.1f}"
                  f"{r['buckets']:>8.1f} of {r['uniform_buckets']:.1f}")
    for n in DISK_THREADS:
        print(f"{f'disk, {n} thread' + ('s' if n > 1 else ''):<28}{disk[str(n)]:>11,.0f}"
              "  random 4 KiB reads/s (os.pread), the spill's disk")
    print(f"bar (spilled, warm): >= 0.8x in memory; anon+ <= {(BUDGET >> 20) + 256} MB; "
          "mixing >= 90% of uniform; exactly once")
    for name, ratio in cold.items():
        print(f"bar ({name}): cold spilled windows/s >= {COLD_BAR}x disk 32-thread 4 KiB "
              f"reads/s: {ratio:.2f}x ({'met' if ratio >= COLD_BAR else 'NOT met'})")
    _save("beyond", **figures, disk=disk, cold_vs_disk=cold)


def _disk(mib: int) -> dict[str, float]:
    """Random 4 KiB reads/s of the spill's disk per thread count (keys: the count)."""
    path = disk_file(mib)
    try:
        return {str(n): disk_reads(path, n) for n in DISK_THREADS}
    finally:
        path.unlink()


def _best(store: str, mode: str, rounds: int = 1) -> dict[str, Any]:
    runs = [_run_child("beyond_epoch", store, mode) for _ in range(rounds)]
    return max(runs, key=lambda r: r["windows_s"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.beyond_memory")
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--formats", nargs="+", default=["zarr", "tfrecord", "parquet"])
    args = parser.parse_args(argv)
    run(args.mib, args.formats)


if __name__ == "__main__":
    main()
