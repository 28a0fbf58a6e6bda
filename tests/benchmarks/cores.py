"""How the readers scale with CPU cores (``make bench-cores``); docs/cores.md.

A store per format of ``SERIES`` series x ``ROWS`` rows x 16 float32 (built
once under ``bench-out/``, then reused), L=32, batch 256. Each measurement
runs in a fresh process pinned to the first 1, 2, ... cores this one may use
(``os.sched_setaffinity`` before it starts, so TensorFlow, Arrow and
windowkit's decode threads size their pools from the pinned cores; the
``tf`` process also sets inter- and intra-op parallelism to that count and
reports the threads TensorFlow made): one warm-up epoch, then ``EPOCHS``
whole epochs timed (each with its reads). Per format, reader and core count
it prints windows/s, the best of the rounds (other processes' load only slows
a run down), and the speedup over the fewest cores; ``bench-out/cores.json``
keeps every run, the medians, the median of the rounds' paired ratios and
the share of the pinned cores other processes took meanwhile. All core
counts of a round run back to back, so they see the same machine load.

Readers (:func:`reader_epochs`, one entry per reader name in ``READERS``):
``tf`` is ``store.tf_dataset(...)``; ``keras`` is ``store.keras_dataset(...,
workers=cores)`` iterated as ``tests.benchmarks.benchmark`` iterates it (in
order, by ``workers`` threads); ``torch`` (once ``Store.torch_dataset``
exists) is ``DataLoader(store.torch_dataset(...), batch_size=None,
num_workers=cores)``. ``--against DIR`` runs every measurement with the
windowkit of another checkout too, side by side.

``--step`` measures instead how long a training step of a small Keras model
waits for its input: the time in ``next(iterator)`` against the whole step.
``--gil`` measures, with py-spy (``pip install py-spy``), the share of a
group read's wall time (the tf.data reader's one ``numpy_function`` call per
group of blocks) during which it holds the interpreter lock.

    python -m tests.benchmarks.cores [--cores 1,2] [--rounds 3] [--readers tf,keras]
    python -m tests.benchmarks.cores --step [--step-batches 300]
    python -m tests.benchmarks.cores --gil [--against ../earlier-checkout]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

from tests.benchmarks import benchmark
from tests.benchmarks.benchmark import BATCH, LENGTH, OUT, _formats, _ordered_batches, _save
from windowkit.bench import peak_rss_mb

SERIES, ROWS = 20, 100_000
EPOCHS = 2  # timed epochs per process, after one warm-up epoch
SOURCE = OUT / "cores-src"
HERE = Path(__file__).resolve().parents[2]

#: ``(store, cores) -> epoch``: ``epoch()`` yields the batches of one epoch
#: (a new one each call); a batch is ``x`` or a tuple whose first item is ``x``.
Epochs = Callable[[Any, int], Callable[[], Iterator[Any]]]


# -- the readers ----------------------------------------------------------------------
def _tf_epochs(store: Any, cores: int) -> Callable[[], Iterator[Any]]:
    ds = store.tf_dataset("train", BATCH, shuffle=True, seed=0)
    return lambda: iter(ds)  # each iteration is a new epoch


def _keras_epochs(store: Any, cores: int) -> Callable[[], Iterator[Any]]:
    ds = store.keras_dataset("train", BATCH, shuffle=True, seed=0, workers=cores)

    def epoch() -> Iterator[Any]:
        if cores == 1:
            yield from (ds[i] for i in range(len(ds)))
        else:
            yield from _ordered_batches(ds, len(ds), cores, ds.max_queue_size)
        ds.on_epoch_end()

    return epoch


def _torch_epochs(store: Any, cores: int) -> Callable[[], Iterator[Any]]:
    from torch.utils.data import DataLoader

    ds = store.torch_dataset("train", BATCH, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=None, num_workers=cores, persistent_workers=True)
    epoch = iter(range(1 << 30))

    def next_epoch() -> Iterator[Any]:
        ds.set_epoch(next(epoch))  # shared with the (persistent) workers
        return iter(loader)

    return next_epoch


READERS: dict[str, Epochs] = {"tf": _tf_epochs, "keras": _keras_epochs, "torch": _torch_epochs}


def available_readers() -> list[str]:
    """The readers this tree has: ``torch`` once ``Store.torch_dataset`` exists."""
    from windowkit.store import Store

    return [r for r in READERS if r != "torch" or hasattr(Store, "torch_dataset")]


def reader_epochs(reader: str, store_path: str, cores: int) -> Callable[[], Iterator[Any]]:
    """The hook: reader ``reader`` (a key of ``READERS``) of the store's training
    split, set up for ``cores`` cores; each call of the result is one epoch."""
    import windowkit as wk

    return READERS[reader](wk.open_store(store_path), cores)


# -- inside a pinned child --------------------------------------------------------------
def _pin_tensorflow(cores: int) -> None:
    """TensorFlow's pools sized to the pinned cores (it reads the affinity mask
    itself too: the thread census in the results shows it, ``tf_Compute``)."""
    import tensorflow as tf

    tf.config.threading.set_inter_op_parallelism_threads(cores)
    tf.config.threading.set_intra_op_parallelism_threads(cores)


def _thread_census() -> dict[str, int]:
    """This process's threads by name (``tf_Compute``: TensorFlow's inter-op pool)."""
    names: dict[str, int] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as fh:
                name = fh.read().strip()
        except OSError:
            continue
        names[name] = names.get(name, 0) + 1
    return names


def _count(epoch: Iterator[Any]) -> int:
    windows = 0
    for batch in epoch:
        x = batch[0] if isinstance(batch, tuple | list) else batch
        windows += int(x.shape[0])
    return windows


def _busy_seconds(cpus: list[int]) -> float:
    """CPU seconds ``cpus`` have run anything since boot (``/proc/stat``; a
    virtual machine's steal counted as busy: the time was not ours)."""
    busy = 0
    with open("/proc/stat") as fh:
        for line in fh:
            name, *fields = line.split()
            if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
                user, nice, system, _, _, irq, softirq, steal = map(int, fields[:8])
                busy += user + nice + system + irq + softirq + steal
    return busy / os.sysconf("SC_CLK_TCK")


def _own_seconds() -> float:
    """CPU seconds of this process and its children (a DataLoader's workers)."""
    import psutil

    me = psutil.Process()
    return sum(sum(p.cpu_times()[:2]) for p in [me, *me.children(recursive=True)])


def child_epochs(reader: str, store_path: str, cores: str) -> dict[str, Any]:
    """One warm-up epoch, then ``EPOCHS`` timed ones: windows/s of each,
    windows per CPU second of the process (and its workers), and
    ``contention``: the share of the pinned cores' time other processes took."""
    n = int(cores)
    if reader == "tf":
        _pin_tensorflow(n)
    epochs = reader_epochs(reader, store_path, n)
    _count(epochs())  # warm-up: pipeline start, caches, autotune, tracing
    cpus = sorted(os.sched_getaffinity(0))
    runs, cpu, others = [], [], []
    for _ in range(EPOCHS):
        start, used, busy = time.perf_counter(), _own_seconds(), _busy_seconds(cpus)
        windows = _count(epochs())
        wall, own = time.perf_counter() - start, _own_seconds() - used
        runs.append(windows / wall)
        cpu.append(windows / max(1e-9, own))
        others.append(max(0.0, _busy_seconds(cpus) - busy - own) / (wall * n))
    return {"windows_s": statistics.median(runs), "epochs": runs, "cpu_windows_s": cpu,
            "contention": statistics.median(others), "windows": windows, "affinity": cpus,
            "threads": _thread_census(), "peak_rss_mb": peak_rss_mb()}


# -- the stores and the pinned runs ---------------------------------------------------------
def make_stores(formats: list[str]) -> dict[str, Path]:
    """The source (``benchmark``'s random walks, ``ROWS`` rows a series) and a
    store per format, each built once and reused while it holds those rows."""
    with mock.patch.object(benchmark, "ROWS", ROWS), mock.patch.object(benchmark, "SERIES",
                                                                       SERIES):
        benchmark._make_throughput_data(SOURCE)
    stores = {}
    for f in formats:
        store = OUT / f"cores-{f}"
        manifest = store / "windowkit.json"
        if not (manifest.is_file() and json.loads(manifest.read_text()).get("total_rows")
                == SERIES * ROWS):
            benchmark._run_child("convert", str(SOURCE / "*.npy"), str(store), f)
        stores[f] = store
    return stores


def _run_pinned(cores: int, *args: str, tree: Path | None = None) -> dict[str, Any]:
    """``child args`` in a fresh interpreter pinned to the first ``cores`` cores
    this process may use (pinned before it starts: what it imports sees them);
    with ``tree``, that tree's ``windowkit`` (and its ``tests.benchmarks``)."""
    cpus = sorted(os.sched_getaffinity(0))[:cores]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(tree or HERE)}
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "child", *args],
                          cwd=HERE, capture_output=True, text=True, env=env, check=False,
                          preexec_fn=lambda: os.sched_setaffinity(0, cpus))
    if proc.returncode != 0:
        raise SystemExit(f"cores child {args} on {cores} cores failed:\n{proc.stderr[-3000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def child_step(reader: str, store_path: str, cores: str, steps: str) -> dict[str, Any]:
    """Training steps of a small Keras model (the window's last step from the
    ones before it): the time each step spends in ``next(iterator)`` against
    the whole step. Epoch after epoch, after ``STEP_WARMUP`` steps."""
    n = int(cores)
    _pin_tensorflow(n)
    import keras

    epochs = reader_epochs(reader, store_path, n)
    model = keras.Sequential([keras.Input((LENGTH - 1, benchmark.FEATURES)),
                              keras.layers.Conv1D(32, 5, activation="relu"),
                              keras.layers.GlobalAveragePooling1D(),
                              keras.layers.Dense(benchmark.FEATURES)])
    model.compile(optimizer="adam", loss="mse")

    def forever() -> Iterator[Any]:
        while True:
            yield from epochs()

    batches = forever()

    def step() -> tuple[float, float]:
        start = time.perf_counter()
        batch = next(batches)
        got = time.perf_counter()
        x = batch[0] if isinstance(batch, tuple | list) else batch
        model.train_on_batch(x[:, :-1], x[:, -1])
        return got - start, time.perf_counter() - start

    for _ in range(STEP_WARMUP):
        step()
    waits, totals = zip(*(step() for _ in range(int(steps))), strict=True)
    return {"steps": int(steps), "wait_s": sum(waits), "step_s": sum(totals),
            "wait_share": sum(waits) / sum(totals), "steps_s": int(steps) / sum(totals),
            "wait_ms": statistics.median(waits) * 1e3,
            "step_ms": statistics.median(totals) * 1e3, "affinity": sorted(os.sched_getaffinity(0))}


STEP_WARMUP = 20


# -- the interpreter lock during group reads ------------------------------------------------
def _py_spy() -> str:
    """The py-spy sampler (a measuring tool only: ``pip install py-spy``)."""
    found = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if found is None:
        raise SystemExit("--gil samples with py-spy: pip install py-spy (into this environment)")
    return found


def _samples(path: Path, keep: Callable[[str], bool]) -> int:
    """Samples of a py-spy raw profile (``stack count`` lines) whose stack ``keep`` takes."""
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and keep(stack):
            total += int(count)
    return total


def child_gil(store_path: str, seconds: str, threads: str) -> dict[str, Any]:
    """Group reads of every block of the training split (what ``tf_dataset``
    reads each epoch when the split fits its budget) through ``GroupLoader``,
    back to back for ``seconds``, sampled by two py-spy processes at once:
    one every ``GIL_RATE``-th of a second of this thread (idle or not), one
    only of the threads holding the interpreter lock. ``share``: the samples
    holding the lock in windowkit's reading code over the samples of this
    thread, so the share of the reads' wall time the lock was held by them.
    ``threads="1"``: the work itself, in this thread alone (windowkit's decode
    threads and Arrow's pool cut to one); ``"all"``: as the readers run."""
    import numpy as np

    import windowkit as wk
    from windowkit.readers.rows.loader import GroupLoader

    if threads == "1":
        import pyarrow as pa

        from windowkit.formats import _checks

        pa.set_cpu_count(1)
        if hasattr(_checks, "usable_cores"):  # an earlier tree has none
            _checks.usable_cores = lambda: 1
    plan = wk.open_store(store_path).read_plan("train")
    blocks = np.arange(plan.layout.num_blocks)
    loader = GroupLoader.of(plan)
    loader(blocks)  # opened, warm
    out = Path(tempfile.mkdtemp(prefix="windowkit-gil-"))
    spies = [subprocess.Popen([_py_spy(), "record", "--pid", str(os.getpid()), "--rate",
                               str(GIL_RATE), "--duration", seconds, "--nonblocking",
                               "--threads", "--format", "raw", "-o", str(out / name), *flags],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for name, flags in (("gil", ["--gil"]), ("all", ["--idle"]))]
    reads, start = 0, time.perf_counter()
    while any(spy.poll() is None for spy in spies):
        loader(blocks)
        reads += 1
    seconds_read = time.perf_counter() - start
    me = f"thread ({threading.get_native_id()})"
    held = _samples(out / "gil", lambda stack: "windowkit/" in stack)
    mine = _samples(out / "all", lambda stack: stack.startswith(me))
    shutil.rmtree(out, ignore_errors=True)
    return {"share": held / max(1, mine), "held": held, "samples": mine,
            "read_s": seconds_read / max(1, reads), "threads": threads,
            "mb": plan.layout.total_rows * plan.layout.row_bytes / 1e6,
            "affinity": sorted(os.sched_getaffinity(0))}


GIL_RATE = 250  # samples a second


CHILDREN: dict[str, Callable[..., dict[str, Any]]] = {
    "epochs": child_epochs, "step": child_step, "gil": child_gil}


# -- drivers ---------------------------------------------------------------------------
def _trees(against: Path | None) -> dict[str, Path | None]:
    return {"this tree": None, **({f"{against}": against.resolve()} if against else {})}


def _speedups(runs: list[dict[str, Any]], base: list[dict[str, Any]]) -> float:
    """The median of each round's windows/s over the same round's at the fewest cores."""
    return statistics.median(r["windows_s"] / b["windows_s"] for r, b in zip(runs, base,
                                                                          strict=True))


def scaling(formats: list[str], readers: list[str], cores: list[int], rounds: int,
            against: Path | None = None) -> list[dict[str, Any]]:
    """Every (format, reader[, tree]) at every core count, ``rounds`` times;
    within a round the core counts run back to back."""
    stores = make_stores(formats)
    trees = _trees(against)
    runs: dict[tuple[str, str, str, int], list[dict[str, Any]]] = {}
    for _ in range(rounds):
        for f in formats:
            for reader in readers:
                for name, tree in trees.items():
                    for n in cores:
                        runs.setdefault((f, reader, name, n), []).append(_run_pinned(
                            n, "epochs", reader, str(stores[f].resolve()), str(n), tree=tree))
    return [{"format": f, "reader": reader, "tree": name,
             "cores": {str(n): _figures(runs[(f, reader, name, n)],
                                        runs[(f, reader, name, cores[0])]) for n in cores}}
            for f in formats for reader in readers for name in trees]


def _figures(runs: list[dict[str, Any]], base: list[dict[str, Any]]) -> dict[str, Any]:
    """One core count's figures: the best round (others' load only slows a run
    down) and its speedup over the best at the fewest cores; the medians, the
    median of the rounds' paired ratios, and the other processes' share of the
    pinned cores beside them."""
    best, first = (max(r["windows_s"] for r in rs) for rs in (runs, base))
    return {"windows_s": best, "speedup": best / first,
            "median_windows_s": statistics.median(r["windows_s"] for r in runs),
            "paired_speedup": _speedups(runs, base),
            "contention": statistics.median(r.get("contention", 0.0) for r in runs),
            "runs": runs}


def steps(formats: list[str], readers: list[str], cores: list[int], rounds: int,
          count: int) -> list[dict[str, Any]]:
    """The input wait of a small model's training steps, per format, reader and cores."""
    stores = make_stores(formats)
    rows = []
    for f in formats:
        for reader in readers:
            for n in cores:
                found = [_run_pinned(n, "step", reader, str(stores[f].resolve()), str(n),
                                     str(count)) for _ in range(rounds)]
                rows.append({"format": f, "reader": reader, "cores": n, "runs": found,
                             **{k: statistics.median(r[k] for r in found)
                                for k in ("wait_share", "steps_s", "wait_ms", "step_ms")}})
                print(f"{f:<9}{reader:<7}{n:>3} cores {rows[-1]['steps_s']:>9.1f} steps/s"
                      f"{rows[-1]['step_ms']:>8.2f} ms a step, {rows[-1]['wait_ms']:.2f} ms in "
                      f"next(): {rows[-1]['wait_share']:.1%} of the time waiting", flush=True)
    return rows


def gil(formats: list[str], rounds: int, seconds: float, against: Path | None = None
        ) -> list[dict[str, Any]]:
    """Each format's group read on two cores: the share of its wall time it
    holds the interpreter lock, single-threaded (the work) and as it runs."""
    stores = make_stores(formats)
    two = min(2, len(os.sched_getaffinity(0)))
    rows = []
    for f in formats:
        for name, tree in _trees(against).items():
            for threads in ("1", "all"):
                found = [_run_pinned(two, "gil", str(stores[f].resolve()), str(seconds),
                                     threads, tree=tree) for _ in range(rounds)]
                row = {"format": f, "tree": name, "threads": threads, "runs": found, **{
                    k: statistics.median(r[k] for r in found) for k in ("share", "read_s", "mb")}}
                rows.append(row)
                print(f"{f:<9}{name:<14}{'one thread' if threads == '1' else 'as it runs':<12}"
                      f"group read of {row['mb']:.0f} MB in {row['read_s'] * 1e3:5.0f} ms, "
                      f"holding the interpreter lock {row['share']:.0%} of it", flush=True)
    return rows


READER_NAMES = {"tf": "`tf_dataset`", "keras": "`keras_dataset`", "torch": "`torch_dataset`"}


def page(fig: dict[str, Any]) -> list[str]:
    """The scaling figures as Markdown (``perf_page``'s shape: ``fig`` is
    ``bench-out/cores.json``): windows/s per core count, speedup over the fewest."""
    from tests.benchmarks.perf_page import DASH, X, _fmt, _n, _table, _when

    counts = [int(n) for n in fig["core_counts"]]
    rows = []
    for r in fig["rows"]:
        tree = "" if r["tree"] == "this tree" else f" ({r['tree']})"
        cells = [f"{_n(r['cores'][str(n)]['windows_s'])}"
                 + (f" ({r['cores'][str(n)]['speedup']:.2f}{X})" if n != counts[0] else "")
                 for n in counts]
        rows.append([f"{_fmt(r['format'])} {READER_NAMES.get(r['reader'], r['reader'])}{tree}",
                     *cells])
    header = ["reader", *(f"{n} core{'s' if n > 1 else ''}: windows/s" for n in counts)]
    busy = [r["cores"][str(counts[-1])].get("contention") for r in fig["rows"]]
    others = (f" Meanwhile other processes took {min(busy):.0%}{DASH}{max(busy):.0%} of the "
              f"{counts[-1]} pinned cores' time (median of the rounds, per reader)."
              if None not in busy and len(counts) > 1 else "")
    return [_when(fig, "make bench-cores"), "", *_table(header, rows), "",
            f"{fig['series']} series {X} {fig['rows_per_series']:,} rows {X} 16 float32, "
            f"L={fig['length']}, batch {fig['batch']}; each process pinned to its cores, one "
            f"warm-up epoch, then {fig['epochs']} whole epochs; best of {fig['rounds']} "
            f"rounds (other processes' load only slows a run down), in brackets the speedup "
            f"over {counts[0]} core{'s' if counts[0] > 1 else ''}.{others}"]


def _cores(text: str | None) -> list[int]:
    """``--cores 1,2,4``: those this process may use (default: 1 up to all of them)."""
    usable = len(os.sched_getaffinity(0))
    asked = [int(c) for c in text.split(",")] if text else list(range(1, usable + 1))
    kept = sorted({c for c in asked if 1 <= c <= usable})
    if len(kept) < len(set(asked)):
        print(f"cores: this process may use {usable} cores; measuring {kept} of {asked}")
    return kept


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["child"]:
        print(json.dumps(CHILDREN[argv[1]](*argv[2:])))
        return
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.cores")
    parser.add_argument("--cores", help="core counts, e.g. 1,2,4 (default: 1 .. all usable)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--formats", help="comma-separated (default: every format)")
    parser.add_argument("--readers", help=f"comma-separated, of {', '.join(READERS)} "
                        "(default: those this tree has)")
    parser.add_argument("--step", action="store_true", help="time a training step's input wait")
    parser.add_argument("--step-batches", type=int, default=300)
    parser.add_argument("--gil", action="store_true",
                        help="a group read's share of the interpreter lock")
    parser.add_argument("--gil-seconds", type=float, default=6,
                        help="seconds of group reads sampled per process (--gil)")
    parser.add_argument("--against", type=Path,
                        help="also run with the windowkit of this tree (an earlier checkout)")
    args = parser.parse_args(argv)
    formats = args.formats.split(",") if args.formats else _formats()
    readers = args.readers.split(",") if args.readers else available_readers()
    cores = _cores(args.cores)
    print(f"data: {SERIES} series x {ROWS:,} rows x 16 float32, L={LENGTH}, batch {BATCH}; "
          f"machine: {os.cpu_count()} cores, this process may use "
          f"{len(os.sched_getaffinity(0))}", flush=True)
    if args.gil:
        _save("cores_gil", rounds=args.rounds, seconds=args.gil_seconds, rate=GIL_RATE,
              rows=gil(formats, args.rounds, args.gil_seconds, args.against))
    elif args.step:
        _save("cores_step", rounds=args.rounds, steps=args.step_batches, core_counts=cores,
              rows=steps(formats, readers, cores, args.rounds, args.step_batches))
    else:
        rows = scaling(formats, readers, cores, args.rounds, args.against)
        figures = {"rounds": args.rounds, "epochs": EPOCHS, "series": SERIES,
                   "rows_per_series": ROWS, "length": LENGTH, "batch": BATCH,
                   "core_counts": cores, "rows": rows}
        _save("cores", **figures)
        print("\n".join(page({**figures, "date": time.strftime("%Y-%m-%d"),
                              "cores": os.cpu_count()})))
        print("other processes' share of the pinned cores (median of rounds), and each "
              "speedup as the median of the rounds' paired ratios:")
        for r in rows:
            print(f"  {r['format']} {r['reader']} {r['tree']}: " + ", ".join(
                f"{n} cores {c['contention']:.0%} busy elsewhere, {c['paired_speedup']:.2f}x"
                for n, c in r["cores"].items()))


if __name__ == "__main__":
    main()
