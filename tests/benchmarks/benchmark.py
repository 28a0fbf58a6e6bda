"""Benchmarks behind ``make bench`` and ``make bench-memory``.

Each measurement runs in its own subprocess so that its peak RSS is its own;
readers are measured side by side in one run and reported as ratios, because
shared machines are noisy.

    python -m tests.benchmarks.benchmark throughput   # windows/s vs materialized windows
    python -m tests.benchmarks.benchmark memory       # 0.5 and 4 GiB .npy: convert, epoch RSS
    python -m tests.benchmarks.benchmark csv          # 2 GiB long CSV: convert peak RSS
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from windowkit.bench import peak_rss_mb

OUT = Path(os.environ.get("WINDOWKIT_BENCH_DIR", "bench-out"))
SERIES, ROWS, FEATURES, LENGTH, BATCH = 20, 20_000, 16, 32, 256


def _run_child(*args: str, checks: bool = True) -> dict[str, Any]:
    """Run one measurement in a fresh interpreter; it prints one JSON line.
    With ``checks=False`` its readers skip the per-block digest checks (to
    measure what they cost)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3",
           "WINDOWKIT_BENCH_CHECKS": "on" if checks else "off"}
    proc = subprocess.run([sys.executable, "-m", "tests.benchmarks.benchmark", "child", *args],
                          capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"benchmark child {args} failed:\n{proc.stderr[-3000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def _save(part: str, **figures: Any) -> None:
    """Keep a part's figures as ``OUT/<part>.json``: ``tests/benchmarks/perf_page.py``
    writes them into the docs' performance page."""
    OUT.mkdir(parents=True, exist_ok=True)
    figures.update(cores=os.cpu_count(), date=time.strftime("%Y-%m-%d", time.gmtime()))
    (OUT / f"{part}.json").write_text(json.dumps(figures, indent=1))


# -- measurements (run inside child processes) ----------------------------------------
def _cpu_seconds() -> float:
    """The process's CPU time so far (user + system, every thread; to the
    microsecond, where ``os.times`` counts 10 ms ticks)."""
    return time.process_time()


def _time_batches(ds: Any, batches: int | None) -> dict[str, Any]:
    """Windows taken from ``ds`` in a Python loop (after 5 warm-up batches),
    the seconds it took and the process's CPU seconds meanwhile:
    ``windows``, ``seconds``, ``windows_s``, ``cpu_windows_s`` (windows per
    CPU-second) and the peak RSS so far."""
    it = iter(ds)
    for _ in range(5):  # warm-up: pipeline start, caches, autotune
        next(it)
    windows, start, cpu = 0, time.perf_counter(), _cpu_seconds()
    for i, batch in enumerate(it):
        x = batch[0] if isinstance(batch, tuple) else batch
        windows += int(x.shape[0])
        if batches is not None and i + 1 >= batches:
            break
    seconds, cpu = time.perf_counter() - start, _cpu_seconds() - cpu
    return {"windows": windows, "seconds": seconds, "windows_s": windows / seconds,
            "cpu_windows_s": windows / max(cpu, 1e-9), "peak_rss_mb": peak_rss_mb()}


def child_convert(source: str, out: str, fmt: str, workers: str = "1") -> dict[str, Any]:
    import windowkit as wk

    start = time.perf_counter()
    store = wk.convert(source, out, format=fmt, window=LENGTH, overwrite=True,
                       workers=int(workers))
    seconds = time.perf_counter() - start
    raw = store.manifest.data["raw_bytes"]
    return {"convert_mb_s": raw / seconds / 1e6, "seconds": seconds,
            "raw_bytes": raw, "peak_rss_mb": peak_rss_mb(),
            "worker_peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
            "imported_tensorflow": "tensorflow" in sys.modules}


def child_convert_plain(source: str, out: str, fmt: str) -> dict[str, Any]:
    """Convert with ``compression="none"``."""
    import windowkit as wk

    start = time.perf_counter()
    wk.convert(source, out, format=fmt, window=LENGTH, overwrite=True, compression="none")
    return {"seconds": time.perf_counter() - start}


def child_beyond_epoch(store_path: str, mode: str) -> dict[str, Any]:
    from tests.benchmarks.beyond_memory import child_epoch

    return child_epoch(store_path, mode)


def _shuffle_arg(mode: str) -> bool | str:
    """A bench mode name as ``shuffle=``: ``default`` is ``True``."""
    return True if mode == "default" else mode


def child_windowkit(store_path: str, batches: str, shuffle: str = "default") -> dict[str, Any]:
    import windowkit as wk

    store = wk.open_store(store_path)
    ds = store.tf_dataset("train", BATCH, shuffle=_shuffle_arg(shuffle), seed=0)
    return _time_batches(ds, None if batches == "epoch" else int(batches))


def child_block_checks(store_path: str, rounds: str) -> dict[str, Any]:
    """Every block (with its halo) read by the store's row reader, checks on and
    off in turn in one process: best of ``rounds`` each (the readers' own cost,
    without tf.data's)."""
    import windowkit as wk
    from windowkit.formats import _checks

    store = wk.open_store(store_path)
    reader, size, total = store.row_reader(), store.manifest.block_rows, store.manifest.total_rows
    slots = [(b, min(total, b + size + store.spec.span - 1)) for b in range(0, total, size)]
    best = {True: float("inf"), False: float("inf")}
    try:
        for _ in range(int(rounds)):
            for on in (True, False):
                _checks._CHECKS = on
                start = time.perf_counter()
                for a, b in slots:
                    reader.read_rows(a, b)
                best[on] = min(best[on], time.perf_counter() - start)
    finally:
        _checks._CHECKS = True
    return {"blocks": len(slots), "on_s": best[True], "off_s": best[False],
            "peak_rss_mb": peak_rss_mb()}


def _ordered_batches(ds: Any, limit: int, workers: int, queue_size: int) -> Iterator[Any]:
    """Batches ``0 .. limit-1`` fetched by ``workers`` threads, in order, at most
    ``queue_size`` ahead: what Keras' ``OrderedEnqueuer`` does with ``workers``."""
    with ThreadPoolExecutor(workers, thread_name_prefix="bench-keras") as pool:
        pending: deque[Future[Any]] = deque()
        for i in range(limit):
            pending.append(pool.submit(ds.__getitem__, i))
            if len(pending) >= queue_size:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def child_keras(store_path: str, batches: str, workers: str = "1") -> dict[str, Any]:
    """``keras_dataset`` iterated batch by batch, as Keras' data adapter does:
    in this thread (one worker), or by ``workers`` threads."""
    import windowkit as wk

    threads = int(workers)
    ds = wk.open_store(store_path).keras_dataset("train", BATCH, shuffle=True, seed=0,
                                                 workers=threads)
    limit = len(ds) if batches == "epoch" else min(len(ds), int(batches))
    batch_iter: Iterator[Any] = (
        (ds[i] for i in range(limit)) if threads == 1
        else _ordered_batches(ds, limit, threads, ds.max_queue_size))
    return {**_time_batches(batch_iter, None), "workers": threads}


def _materialized_windows(source_dir: str) -> np.ndarray:
    """Every window of every series of ``source_dir``, copied out: ``[n, L, F]``."""
    return np.concatenate([
        np.lib.stride_tricks.sliding_window_view(np.load(p), LENGTH, axis=0).transpose(0, 2, 1)
        for p in sorted(Path(source_dir).glob("*.npy"))])


def child_materialized(source_dir: str, batches: str) -> dict[str, Any]:
    """The plain approach: every window in memory, ``shuffle(10000).batch(B)``."""
    import tensorflow as tf

    windows = _materialized_windows(source_dir)
    ds = tf.data.Dataset.from_tensor_slices(windows).shuffle(10_000, seed=0).batch(BATCH)
    ds = ds.prefetch(tf.data.AUTOTUNE)
    return {**_time_batches(ds, None if batches == "epoch" else int(batches)),
            "materialized_bytes": windows.nbytes}


def child_permuted(source_dir: str) -> dict[str, Any]:
    """Every window materialized and permuted once, ``from_tensor_slices(...).batch(B)``:
    the fastest a uniformly shuffled epoch can be fed from memory."""
    import tensorflow as tf

    windows = _materialized_windows(source_dir)
    windows = windows[np.random.default_rng(0).permutation(len(windows))]
    ds = tf.data.Dataset.from_tensor_slices(windows).batch(BATCH).prefetch(tf.data.AUTOTUNE)
    return _time_batches(ds, None)


def child_mixing(store_path: str, shuffle: str) -> dict[str, Any]:
    """Distinct series and storage blocks per batch of one epoch, next to what a
    uniform permutation of the same windows gives (``windowkit bench``'s figures)."""
    from dataclasses import asdict

    import windowkit as wk
    from windowkit.bench import batch_mixing

    mixing = batch_mixing(wk.open_store(store_path), split="train", batch_size=BATCH,
                          reader="tf", shuffle=shuffle, seed=0)
    return asdict(mixing)


def child_shard(store_path: str, num_shards: str, shard_index: str, shuffle: str
                ) -> dict[str, Any]:
    """One epoch of one shard: windows, seconds, and the bytes this process read
    from files meanwhile (``read_chars``: page cache included)."""
    import psutil
    import tensorflow  # noqa: F401  (its own files are not the store's)

    import windowkit as wk

    store = wk.open_store(store_path)
    io = psutil.Process().io_counters
    before, start = io().read_chars, time.perf_counter()
    ds = store.tf_dataset("train", BATCH, shuffle=_shuffle_arg(shuffle), seed=0,
                          num_shards=int(num_shards), shard_index=int(shard_index))
    windows = sum(int(b.shape[0]) for b in ds)
    seconds = time.perf_counter() - start
    return {"windows": windows, "seconds": seconds, "windows_s": windows / seconds,
            "read_bytes": io().read_chars - before, "peak_rss_mb": peak_rss_mb()}


PARTS_EPOCHS = 2  # per measurement: one epoch (~0.3 s) is shorter than the machine's noise


def _parts_epochs(store_path: str, reader: str, as_dict: bool) -> Callable[[], int]:
    """A function that reads ``PARTS_EPOCHS`` epochs of a store's training
    batches and returns how many windows it read: plain ``(x, y)`` batches, or
    dict batches (``inputs``, ``future_known``, ``series``). Warmed up."""
    import windowkit as wk

    store = wk.open_store(store_path)
    if reader == "tf":  # consumed in the graph, as model.fit does (not tensor by tensor)
        import tensorflow as tf

        ds = store.tf_dataset("train", BATCH, seed=0, return_series=as_dict)
        first = next(iter(ds))
        assert isinstance(first[0], dict) == as_dict, "the store does not give the asked batches"
        epochs = ds.repeat(PARTS_EPOCHS)

        @tf.function
        def drain(iterator: Any) -> Any:
            count = tf.constant(0, tf.int64)
            for x, _ in iterator:
                count += tf.shape(x["inputs"] if as_dict else x, out_type=tf.int64)[0]
            return count

        drain(iter(ds.take(8)))  # traced, and the pipeline's functions warm
        return lambda: int(drain(iter(epochs)))
    keras_ds = store.keras_dataset("train", BATCH, seed=0, return_series=as_dict)
    first = keras_ds[0]
    assert isinstance(first[0], dict) == as_dict, "the store does not give the asked batches"

    def read() -> int:
        windows = 0
        for _ in range(PARTS_EPOCHS):
            for i in range(len(keras_ds)):
                x, _ = keras_ds[i]
                windows += len(x["inputs"] if as_dict else x)
            keras_ds.on_epoch_end()
        return windows

    return read


def child_parts(plain_store: str, dict_store: str, reader: str, rounds: str) -> dict[str, Any]:
    """Plain and dict batches of the same data, read in one process, ``rounds``
    times each, alternating (plain first in even rounds, dict first in odd
    ones): both see the same process and the same machine load."""
    readers = {"plain": _parts_epochs(plain_store, reader, False),
               "dict": _parts_epochs(dict_store, reader, True)}
    runs: dict[str, list[float]] = {"plain": [], "dict": [], "plain_cpu": [], "dict_cpu": []}
    for r in range(int(rounds)):
        for parts in ("plain", "dict") if r % 2 == 0 else ("dict", "plain"):
            start, cpu = time.perf_counter(), time.process_time()
            windows = readers[parts]()
            runs[parts].append(windows / (time.perf_counter() - start))
            runs[parts + "_cpu"].append(windows / (time.process_time() - cpu))
    return {**runs, "peak_rss_mb": peak_rss_mb()}


def child_forecast_convert(source: str, out: str, fmt: str, known: str) -> dict[str, Any]:
    """The forecasting stores: targets only (plain batches), or with known columns."""
    import windowkit as wk

    wk.convert(source, out, format=fmt, window=wk.WindowSpec(LENGTH, horizon=8),
               target_columns=["0"], known_columns=["1", "2", "3"] if known == "yes" else None,
               overwrite=True)
    return {}


def child_tf_import() -> dict[str, Any]:
    import tensorflow  # noqa: F401

    return {"peak_rss_mb": peak_rss_mb()}


def child_convert_csv(source: str, out: str, fmt: str) -> dict[str, Any]:
    import windowkit as wk

    start = time.perf_counter()
    store = wk.convert(source, out, format=fmt, window=LENGTH, overwrite=True,
                       series_col="series", time_col="time")
    seconds = time.perf_counter() - start
    size = os.path.getsize(source)
    return {"csv_mb_s": size / seconds / 1e6, "seconds": seconds, "csv_bytes": size,
            "rows": store.manifest.total_rows, "windows": store.num_windows("train"),
            "peak_rss_mb": peak_rss_mb(), "imported_tensorflow": "tensorflow" in sys.modules}


CHILDREN: dict[str, Callable[..., dict[str, Any]]] = {
    "convert": child_convert, "convert_csv": child_convert_csv, "windowkit": child_windowkit,
    "convert_plain": child_convert_plain, "beyond_epoch": child_beyond_epoch,
    "keras": child_keras, "materialized": child_materialized, "tf_import": child_tf_import,
    "permuted": child_permuted, "mixing": child_mixing, "shard": child_shard,
    "parts": child_parts, "forecast_convert": child_forecast_convert,
    "block_checks": child_block_checks,
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


def _formats() -> list[str]:
    """Every format, or those named in ``WINDOWKIT_BENCH_FORMATS`` (comma-separated)."""
    from windowkit.formats import FORMATS

    chosen = os.environ.get("WINDOWKIT_BENCH_FORMATS")
    return sorted(chosen.split(",") if chosen else FORMATS)


def _disk_bytes(store: Path) -> int:
    return sum(p.stat().st_size for p in (store / "data").rglob("*") if p.is_file())


def throughput(rounds: int) -> None:
    source_dir = OUT / "throughput-src"
    _make_throughput_data(source_dir)
    formats = _formats()
    conv = {f: _run_child("convert", str(source_dir / "*.npy"), str(OUT / f"throughput-{f}"), f)
            for f in formats}
    tf_base = _run_child("tf_import")
    readers = [(f, reader) for f in formats for reader in ("tf_dataset", "keras_dataset")]
    keras2 = [(f, "keras_dataset x2") for f in formats]
    unchecked = [(f, f"{reader} unchecked") for f, reader in readers]
    results: dict[Any, list[dict[str, Any]]] = {
        key: [] for key in ["materialized", *readers, *keras2, *unchecked]}
    for _ in range(rounds):  # alternate, so every reader sees the same machine load
        results["materialized"].append(_run_child("materialized", str(source_dir), "epoch"))
        for f, reader in readers:
            store = str(OUT / f"throughput-{f}")
            child = (("windowkit", store, "epoch") if reader == "tf_dataset"
                     else ("keras", store, "epoch", "1"))
            for checks in (True, False):  # checks on and off side by side
                key = (f, reader if checks else f"{reader} unchecked")
                results[key].append(_run_child(*child, checks=checks))
            if reader == "keras_dataset":
                results[(f, "keras_dataset x2")].append(_run_child("keras", store, "epoch", "2"))
    best = {k: max(v, key=lambda r: r["windows_s"]) for k, v in results.items()}
    plain = best["materialized"]["windows_s"]
    raw = conv[formats[0]]["raw_bytes"]
    print(f"data: {SERIES} series x {ROWS:,} rows x {FEATURES} float32 features "
          f"({raw / 2**20:.0f} MiB raw), window L={LENGTH}, batch {BATCH}, shuffled, "
          f"best of {rounds} full epochs; machine: {os.cpu_count()} cores")
    print("keras_dataset: windows/s with 1 worker (batches read in turn) and with 2 worker "
          "threads (in order, as Keras' workers=2 reads them)")
    print(f"{'reader':<46}{'windows/s':>11}{'per CPU-s':>11}{'vs plain':>10}{'peak RSS':>11}"
          f"{'disk/raw':>10}{'convert':>12}{'2 workers':>11}{'RSS':>8}")
    for f, reader in readers:
        r, c = best[(f, reader)], conv[f]
        two = ""
        if reader == "keras_dataset":
            r2 = best[(f, "keras_dataset x2")]
            two = f"{r2['windows_s']:>11,.0f}{r2['peak_rss_mb']:>5.0f} MB"
        print(f"{f + ' ' + reader + ' (windowkit)':<46}{r['windows_s']:>11,.0f}"
              f"{r['cpu_windows_s']:>11,.0f}"
              f"{r['windows_s'] / plain:>9.2f}x{r['peak_rss_mb']:>8.0f} MB"
              f"{_disk_bytes(OUT / f'throughput-{f}') / raw:>9.2f}x"
              f"{c['convert_mb_s']:>7.0f} MB/s{two}")
    m = best["materialized"]
    print(f"{'plain: materialized windows, shuffle(10000)':<46}{m['windows_s']:>11,.0f}"
          f"{m['cpu_windows_s']:>11,.0f}{1:>9.2f}x{m['peak_rss_mb']:>8.0f} MB")
    for line in cpu_bars(best, formats):
        print(line)
    print(f"tensorflow import alone: peak RSS {tf_base['peak_rss_mb']:.0f} MB; "
          f"materialized windows: {m['materialized_bytes'] / 2**20:.0f} MiB")
    blocks = {f: _run_child("block_checks", str(OUT / f"throughput-{f}"), "9")
              for f in formats}
    _print_check_cost(readers, best, blocks)
    _save("throughput", rounds=rounds, raw_bytes=raw, tf_import=tf_base, convert=conv,
          cpu_bars=cpu_bars(best, formats),
          best={k if isinstance(k, str) else " ".join(k): v for k, v in best.items()},
          disk_bytes={f: _disk_bytes(OUT / f"throughput-{f}") for f in formats})


def cpu_bars(best: dict[Any, dict[str, Any]], formats: list[str]) -> list[str]:
    """Per format: ``tf_dataset``'s CPU per window against ``keras_dataset``'s,
    both taken in the same Python loop (the bar: at most 1.3x)."""
    out = []
    for f in formats:
        tf_cpu, keras_cpu = (best[(f, r)]["cpu_windows_s"] for r in ("tf_dataset", "keras_dataset"))
        out.append(f"{f}: tf_dataset spends {keras_cpu / tf_cpu:.2f}x keras_dataset's CPU per "
                   "window (bar 1.3x)")
    return out


def _print_check_cost(readers: list[tuple[str, str]], best: dict[Any, dict[str, Any]],
                      blocks: dict[str, dict[str, Any]]) -> None:
    """The per-block digest checks' cost: each reader with them on vs. off (bar: 5%),
    and every block read by the row reader alone (one process, on and off in turn)."""
    print("per-block checks (digest of every block read): windows/s with checks on vs. off")
    print(f"{'reader':<30}{'checks on':>11}{'off':>11}{'on/off':>8}{'RSS on':>9}{'RSS off':>9}")
    for f, reader in readers:
        on, off = best[(f, reader)], best[(f, f"{reader} unchecked")]
        print(f"{f + ' ' + reader:<30}{on['windows_s']:>11,.0f}{off['windows_s']:>11,.0f}"
              f"{on['windows_s'] / off['windows_s']:>8.3f}{on['peak_rss_mb']:>6.0f} MB"
              f"{off['peak_rss_mb']:>6.0f} MB")
    for f, b in blocks.items():
        on_ms, off_ms = b["on_s"] * 1e3, b["off_s"] * 1e3
        print(f"{f + ' row reader, every block':<30}{on_ms:>8.1f} ms{off_ms:>8.1f} ms"
              f"{off_ms / on_ms:>8.3f}{b['peak_rss_mb']:>6.0f} MB  (time: off/on)")


def _run_children_at_once(*arg_lists: tuple[str, ...]) -> list[dict[str, Any]]:
    """Run several measurements at the same time, one process each."""
    with ThreadPoolExecutor(len(arg_lists)) as pool:
        return list(pool.map(lambda args: _run_child(*args), arg_lists))


def shuffling(rounds: int) -> None:
    """Global shuffle against every window materialized and permuted once, how
    well each mode mixes a batch, and 2-way sharded reading, in one run."""
    source_dir = OUT / "throughput-src"
    _make_throughput_data(source_dir)
    formats = _formats()
    for f in formats:
        if not (OUT / f"throughput-{f}" / "windowkit.json").exists():
            _run_child("convert", str(source_dir / "*.npy"), str(OUT / f"throughput-{f}"), f)
    runs: dict[str, list[dict[str, Any]]] = {"permuted": []}
    for _ in range(rounds):  # alternate, so every reader sees the same machine load
        runs["permuted"].append(_run_child("permuted", str(source_dir)))
        for f in formats:
            for mode in ("default", "global", "blocks"):
                runs.setdefault(f"{f} {mode}", []).append(
                    _run_child("windowkit", str(OUT / f"throughput-{f}"), "epoch", mode))
    best = {k: max(v, key=lambda r: r["windows_s"]) for k, v in runs.items()}
    base, mixes = best["permuted"]["windows_s"], {}
    print(f"data: the throughput data, L={LENGTH}, batch {BATCH}, best of {rounds} epochs; "
          f"baseline: every window materialized, permuted once, from_tensor_slices.batch")
    print(f"{'tf_dataset':<22}{'windows/s':>11}{'per CPU-s':>11}{'vs permuted':>13}"
          f"{'peak RSS':>11}{'series/batch':>14}{'blocks/batch':>14}")
    for f in formats:
        for mode in ("default", "global", "blocks"):
            r = best[f"{f} {mode}"]
            mix = mixes[f"{f} {mode}"] = _run_child("mixing", str(OUT / f"throughput-{f}"), mode)
            print(f"{f + ' ' + mode:<22}{r['windows_s']:>11,.0f}{r['cpu_windows_s']:>11,.0f}"
                  f"{r['windows_s'] / base:>12.2f}x"
                  f"{r['peak_rss_mb']:>8.0f} MB{mix['series']:>8.1f} of {mix['uniform_series']:.1f}"
                  f"{mix['blocks']:>8.1f} of {mix['uniform_blocks']:.1f}")
    p = best["permuted"]
    print(f"{'materialized, permuted':<22}{base:>11,.0f}{p['cpu_windows_s']:>11,.0f}"
          f"{1:>12.2f}x{p['peak_rss_mb']:>8.0f} MB")
    tf_base = _run_child("tf_import")
    print(f"tensorflow import alone: peak RSS {tf_base['peak_rss_mb']:.0f} MB")
    _save("shuffling", rounds=rounds, best=best, mixing=mixes, tf_import=tf_base)
    sharding(formats, rounds)


def sharding(formats: list[str], rounds: int) -> None:
    """Each format read whole by one process, then as 2 shards by two processes
    at once: windows/s and bytes each read (a shard must read only its half)."""
    print(f"2-way sharded reading: one epoch each, best of {rounds}; the shards run at the "
          f"same time, one process each; MB read: bytes read from files during the epoch")
    print(f"{'tf_dataset':<18}{'whole: windows/s':>17}{'MB read':>9}   "
          f"{'shard 0: windows, /s, MB read':>31}   {'shard 1':>27}   {'together':>12}")
    rows: list[dict[str, Any]] = []
    for f in formats:
        store = str(OUT / f"throughput-{f}")
        data_mb = _disk_bytes(OUT / f"throughput-{f}") / 1e6
        for mode in ("blocks", "global"):
            whole = max((_run_child("shard", store, "1", "0", mode) for _ in range(rounds)),
                        key=lambda r: r["windows_s"])
            tries = [_run_children_at_once(("shard", store, "2", "0", mode),
                                           ("shard", store, "2", "1", mode))
                     for _ in range(rounds)]
            shards = max(tries, key=lambda t: sum(r["windows"] for r in t)
                         / max(r["seconds"] for r in t))
            together = sum(r["windows"] for r in shards) / max(r["seconds"] for r in shards)
            cells = "   ".join(f"{r['windows']:>9,}{r['windows_s']:>11,.0f}"
                               f"{r['read_bytes'] / 1e6:>9.1f}" for r in shards)
            print(f"{f + ' ' + mode:<18}{whole['windows_s']:>17,.0f}"
                  f"{whole['read_bytes'] / 1e6:>9.1f}   {cells}   {together:>10,.0f}/s"
                  f"  ({together / whole['windows_s']:.2f}x whole; data {data_mb:.1f} MB)")
            rows.append({"format": f, "mode": mode, "whole": whole, "shards": shards,
                         "together": together, "data_mb": data_mb})
    _save("sharding", rounds=rounds, rows=rows)


def forecasting(rounds: int) -> None:
    """Dict batches (known-future columns and series ids) against plain ``(x, y)``
    batches of the same store, each reader, in one run."""
    source_dir = OUT / "throughput-src"
    _make_throughput_data(source_dir)
    print(f"forecasting stores: the throughput data, L={LENGTH}, horizon 8, target column 0; "
          f"plain: (x, y) batches; dict: known columns 1-3 and return_series=True; "
          f"batch {BATCH}; one process per reader reads plain and dict {PARTS_EPOCHS} epochs "
          f"at a time, alternating, {rounds} times each: medians, and the median (quartiles) "
          f"of the rounds' dict / plain ratios")
    print(f"{'reader':<18}{'(x, y) windows/s':>18}{'dict windows/s':>16}{'dict / plain':>14}"
          f"{'quartiles':>15}{'per CPU second':>16}")
    rows: list[dict[str, Any]] = []
    for f in _formats():
        stores = {"plain": OUT / f"forecast-plain-{f}", "dict": OUT / f"forecast-{f}"}
        for parts, store in stores.items():
            _run_child("forecast_convert", str(source_dir / "*.npy"), str(store), f,
                       "yes" if parts == "dict" else "no")
        for reader in ("tf", "keras"):
            runs = _run_child("parts", str(stores["plain"]), str(stores["dict"]), reader,
                              str(rounds))
            # each round's pair saw the same load: the median of their ratios
            ratios = np.divide(runs["dict"], runs["plain"])
            low, mid, high = np.percentile(ratios, [25, 50, 75])
            cpu = np.median(np.divide(runs["dict_cpu"], runs["plain_cpu"]))
            print(f"{f + ' ' + reader:<18}{np.median(runs['plain']):>18,.0f}"
                  f"{np.median(runs['dict']):>16,.0f}{mid:>13.2f}x{low:>8.2f}-{high:.2f}x"
                  f"{cpu:>15.2f}x", flush=True)
            rows.append({"format": f, "reader": reader, "plain": np.median(runs["plain"]),
                         "ratio": mid, "low": low, "high": high, "cpu_ratio": cpu})
    print("per CPU second: the same ratio of windows per second of the process's CPU time, "
          "which other processes on the machine disturb less")
    print("bar: dict batches within 10% of plain batches (dict / plain >= 0.90)")
    _save("forecasting", rounds=rounds, rows=[{k: float(v) if k not in ("format", "reader")
                                               else v for k, v in r.items()} for r in rows])


def _memory_source(gib: float) -> tuple[Path, int]:
    """A float32 ``.npy`` of ``gib`` GiB of random rows, written in bounded memory."""
    source = OUT / f"memory-src-{gib:g}gib.npy"
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
    return source, rows


def memory(sizes: list[float]) -> None:
    """Convert and read stores of each size: convert speed and RSS, and whether a
    reader's peak RSS stays flat as the store grows."""
    base = _run_child("tf_import")
    print(f"float32 .npy sources, {FEATURES} features, L={LENGTH}, B={BATCH}; tensorflow "
          f"import alone: peak RSS {base['peak_rss_mb']:.0f} MB; machine: {os.cpu_count()} cores")
    print(f"{'format':<9}{'size':>6}{'convert':>9}{'MB/s':>6}{'RSS':>8}   {'--workers 2':>11}"
          f"{'MB/s':>6}{'RSS main+worker':>17}   {'epoch windows':>14}"
          f"{'tf_dataset':>12}{'RSS':>8}{'keras_dataset':>15}{'RSS':>8}", flush=True)
    rss: dict[tuple[str, str], list[float]] = {}
    rows: list[dict[str, Any]] = []
    for f in _formats():
        for gib in sizes:
            source, _ = _memory_source(gib)
            store = OUT / f"memory-{f}"
            conv = _run_child("convert", str(source), str(store), f)
            parallel = _run_child("convert", str(source), str(store), f, "2")
            tf_epoch = _run_child("windowkit", str(store), "epoch")
            keras_epoch = _run_child("keras", str(store), "epoch")
            rss.setdefault((f, "tf_dataset"), []).append(tf_epoch["peak_rss_mb"])
            rss.setdefault((f, "keras_dataset"), []).append(keras_epoch["peak_rss_mb"])
            print(f"{f:<9}{gib:>4g}Gi{conv['seconds']:>8.0f}s{conv['convert_mb_s']:>6.0f}"
                  f"{conv['peak_rss_mb']:>5.0f} MB   {parallel['seconds']:>10.0f}s"
                  f"{parallel['convert_mb_s']:>6.0f}{parallel['peak_rss_mb']:>8.0f}+"
                  f"{parallel['worker_peak_rss_mb']:.0f} MB   {tf_epoch['windows']:>14,}"
                  f"{tf_epoch['windows_s']:>10,.0f}/s{tf_epoch['peak_rss_mb']:>5.0f} MB"
                  f"{keras_epoch['windows_s']:>13,.0f}/s{keras_epoch['peak_rss_mb']:>5.0f} MB",
                  flush=True)
            rows.append({"format": f, "gib": gib, "convert": conv, "parallel": parallel,
                         "tf": tf_epoch, "keras": keras_epoch})
            if os.environ.get("WINDOWKIT_BENCH_KEEP") != "1":
                shutil.rmtree(store, ignore_errors=True)
    if len(sizes) > 1:
        growth = "; ".join(f"{f} {reader} {values[-1] - values[0]:+.0f} MB"
                           for (f, reader), values in rss.items())
        print(f"reader peak RSS, {sizes[-1]:g} GiB store minus {sizes[0]:g} GiB: {growth}")
    print("bars: convert < 600 MB peak RSS and never imports tensorflow; --workers 2 convert "
          ">= 100 MB/s; reader RSS within 100 MB across store sizes")
    _save("memory", tf_import=base, rows=rows)


_CSV_SERIES, _CSV_CHUNK = 50, 200_000


def _csv_lines(series: np.ndarray, times: np.ndarray, values: np.ndarray) -> str:
    """Rows ``series,time,x0..x7`` as CSV text."""
    return "\n".join(f"s{s:02d},{t}," + ",".join(map(str, row)) for s, t, row in
                     zip(series.tolist(), times.tolist(), values.tolist(), strict=True)) + "\n"


def _write_csv(path: Path, chunks: Iterator[str]) -> Path:
    """Write the CSV once (header, then ``chunks``) and reuse it afterwards."""
    if path.exists():
        return path
    OUT.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as fh:
        fh.write("series,time," + ",".join(f"x{i}" for i in range(8)) + "\n")
        for text in chunks:
            fh.write(text)
    tmp.rename(path)
    return path


def _csv_source(gib: float) -> Path:
    """A long CSV (series, time, 8 float features) of about ``gib`` GiB, written
    in chunks: 50 series, each a run of rows one second apart."""

    def chunks() -> Iterator[str]:
        rng = np.random.default_rng(0)
        target, written, rows_per_series = int(gib * 2**30), 0, None
        for sid in range(_CSV_SERIES):
            start = 0
            while rows_per_series is None or start < rows_per_series:
                text = _csv_lines(np.full(_CSV_CHUNK, sid), start + np.arange(_CSV_CHUNK),
                                  rng.normal(size=(_CSV_CHUNK, 8)).round(5))
                yield text
                written += len(text)
                start += _CSV_CHUNK
                if rows_per_series is None and written * _CSV_SERIES >= target:
                    rows_per_series = start

    return _write_csv(OUT / f"csv-src-{gib:g}gib.csv", chunks())


def _interleaved_csv_source(gib: float) -> Path:
    """A long CSV like :func:`_csv_source` whose 50 series interleave (a log in
    time order): windowkit groups it in memory."""

    def chunks() -> Iterator[str]:
        rng = np.random.default_rng(1)
        written, row = 0, 0
        while written < gib * 2**30:
            rows = row + np.arange(_CSV_CHUNK)
            text = _csv_lines(rows % _CSV_SERIES, rows // _CSV_SERIES,
                              rng.normal(size=(_CSV_CHUNK, 8)).round(5))
            yield text
            written += len(text)
            row += _CSV_CHUNK

    return _write_csv(OUT / f"csv-interleaved-{gib:g}gib.csv", chunks())


def csv(gib: float, interleaved_gib: float) -> None:
    """Convert a long CSV larger than the budget: peak RSS must stay under 1 GB.
    Then a smaller one whose series interleave, grouped in memory."""
    figures: dict[str, Any] = {"formats": {}}
    for f in _formats()[:1] if interleaved_gib > 0 else []:
        source = _interleaved_csv_source(interleaved_gib)
        store = OUT / "csv-interleaved"
        r = _run_child("convert_csv", str(source), str(store), f)
        print(f"interleaved: {source.stat().st_size / 2**20:.0f} MiB CSV of 50 interleaved "
              f"series -> {f}: {r['rows']:,} rows grouped in memory, {r['seconds']:.0f} s, "
              f"peak RSS {r['peak_rss_mb']:.0f} MB", flush=True)
        figures["interleaved"] = {**r, "format": f, "series": 50}
        shutil.rmtree(store, ignore_errors=True)
    source = _csv_source(gib)
    print(f"source: {source} ({source.stat().st_size / 2**30:.2f} GiB long CSV: series, "
          f"time, 8 float columns); machine: {os.cpu_count()} cores")
    for f in _formats():
        store = OUT / f"csv-{f}"
        r = _run_child("convert_csv", str(source), str(store), f)
        print(f"{f:<9} {r['rows']:,} rows, {r['windows']:,} windows in {r['seconds']:.0f} s "
              f"({r['csv_mb_s']:.0f} MB/s of CSV), peak RSS {r['peak_rss_mb']:.0f} MB",
              flush=True)
        figures["formats"][f] = r
        shutil.rmtree(store, ignore_errors=True)
    print("bar: peak RSS < 1 GB")
    _save("csv", series=50, **figures)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.benchmark")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("throughput")
    p.add_argument("--rounds", type=int, default=2)
    p = sub.add_parser("memory")
    p.add_argument("--gib", type=float, nargs="+", default=[0.5, 4.0],
                   help="store sizes (GiB of raw rows)")
    p = sub.add_parser("csv")
    p.add_argument("--gib", type=float, default=2.0)
    p.add_argument("--interleaved-gib", type=float, default=0.25,
                   help="size of the interleaved CSV grouped in memory (0: skip)")
    p = sub.add_parser("shuffling")
    p.add_argument("--rounds", type=int, default=2)
    p = sub.add_parser("forecasting")
    p.add_argument("--rounds", type=int, default=25)
    p = sub.add_parser("child")
    p.add_argument("name", choices=sorted(CHILDREN))
    p.add_argument("args", nargs="*")
    args = parser.parse_args(argv)
    if args.command == "throughput":
        throughput(args.rounds)
    elif args.command == "memory":
        memory(args.gib)
    elif args.command == "shuffling":
        shuffling(args.rounds)
    elif args.command == "forecasting":
        forecasting(args.rounds)
    elif args.command == "csv":
        csv(args.gib, args.interleaved_gib)
    else:
        if os.environ.get("WINDOWKIT_BENCH_CHECKS") == "off":
            from windowkit.formats import _checks

            _checks._CHECKS = False  # the private switch: only to measure the checks' cost
        print(json.dumps(CHILDREN[args.name](*args.args)))


if __name__ == "__main__":
    main()
