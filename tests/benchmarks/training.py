"""Every reader consumed the way training consumes it, at the mission's scale,
beside windows materialized in memory (``make bench``).

    python -m tests.benchmarks.training [--mib 256] [--formats zarr tfrecord parquet]
                                        [--rounds 2]

The data is :mod:`tests.benchmarks.beyond_memory`'s: 20 series x 16 float32
(256 MiB of rows by default, ``compression="none"``), windows of 32, batch
256, shuffled. Each line runs in a fresh process; it reports windows/s, the
process's CPU time per million windows (user + system, over the timed part),
and its peak RSS and peak anonymous memory (``RssAnon``: what it cannot give
back; a spill's mapped pages are page cache) over the baseline of the imported
frameworks, beside the bytes of rows the line holds by design. The consumers:

- ``tf.function``: every batch of one epoch drained inside a ``tf.function``
  (no Python per batch), ``tf_dataset`` per format (the default
  ``shuffle=True``) and spilled (``shuffle="global"``, ``memory_budget=64
  MiB``, warm), and the materialized windows;
- ``fit``: Keras ``fit`` of a small autoencoder (two ``Dense`` layers over the
  features of each step) on 2 cores, steps 200..3,200 timed by a callback,
  from ``tf_dataset`` (default and spilled), ``keras_dataset`` and the
  materialized windows (``from_tensor_slices(windows).batch(256)``);
- ``fit trivial``: the same, with a model whose step costs next to nothing
  (the mean of ``x`` over time, then one ``Dense`` unit, against zeros), where
  the reader's own cost shows: the materialized windows, ``tf_dataset`` per
  format (default) and spilled, and ``keras_dataset``;
- ``torch loop``: the same model in PyTorch, an SGD step per batch, from
  ``torch_dataset`` through ``DataLoader(ds, batch_size=None)`` and from the
  materialized windows (a tensor, each batch one index by a random permutation);
- ``loop``: a Python loop that only takes each batch: the materialized
  windows (``from_tensor_slices(windows).batch(256)``), ``tf_dataset`` per
  format (as many windows as are materialized), one core's NumPy gather
  of the held rows (``np.take``'s limit), ``keras_dataset`` batch by batch,
  ``grain_batches`` under Grain and a 30-line Grain source whose item is a
  batch (one fancy index over a ``np.memmap``), both with Grain's
  ``ReadOptions(num_threads=0)`` and with one thread reading 4 batches ahead.

Each line is the best of ``--rounds`` runs (``fit``: one more), the rounds
interleaved, since another process's load only slows a run down.
*Materialized* windows are the first 3,400 batches' worth (900 thousand
windows, 1.8 GB: every window of the split would be 8.6 GB), permuted once.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tests.benchmarks.benchmark import OUT, _run_child, _save
from tests.benchmarks.beyond_memory import SERIES, PeakRss, _anon_mb, _rss_mb, make_source

LENGTH, BATCH = 32, 256
SPILL_BUDGET = 64 << 20
WARMUP, STEPS = 200, 3000  # fit and torch: steps timed after the warm-up ones
MATERIALIZED_BATCHES = 3400
ROWS_SLACK_MB = 256  # the bar: peak RSS over the import <= rows held + this
REFERENCES = ("materialized", "np.take", "memmap:0", "memmap:1")  # not windowkit's


class Measure:
    """Windows, wall and CPU time of the timed part, and the peak memory of
    the whole line over the baseline taken at construction."""

    def __init__(self) -> None:
        self.baseline, self.anon_baseline = _rss_mb(), _anon_mb()
        self.watch = PeakRss()
        self.windows, self.seconds, self.cpu = 0, 0.0, 0.0
        self._t0, self._c0 = 0.0, 0.0

    def start(self) -> None:
        self._t0, self._c0 = time.perf_counter(), _cpu()

    def stop(self, windows: int) -> None:
        self.seconds, self.cpu = time.perf_counter() - self._t0, _cpu() - self._c0
        self.windows = windows

    def result(self, rows_bytes: int) -> dict[str, Any]:
        peak = self.watch.stop()
        return {"windows": self.windows, "seconds": self.seconds,
                "windows_s": self.windows / self.seconds,
                "cpu_s_per_m": self.cpu / self.windows * 1e6,
                "peak_over_mb": peak - self.baseline,
                "anon_over_mb": self.watch.peak_anon_mb - self.anon_baseline,
                "rows_mb": rows_bytes / 2**20}


def _cpu() -> float:
    """The process's CPU time so far (user + system, every thread)."""
    return time.process_time()


# -- the data -----------------------------------------------------------------------
def _source_rows(source: str) -> tuple[np.ndarray, np.ndarray]:
    """Every series' rows, one array (memory-mapped), and the valid window starts."""
    paths = sorted(Path(source).glob("s*.npy"))
    joined = Path(source).with_name(Path(source).name + "-joined.npy")  # not a series
    if not joined.exists():
        parts = [np.load(p, mmap_mode="r") for p in paths]
        out = np.lib.format.open_memmap(joined, mode="w+", dtype=np.float32,
                                        shape=(sum(len(p) for p in parts), parts[0].shape[1]))
        at = 0
        for part in parts:
            out[at:at + len(part)] = part
            at += len(part)
        out.flush()
        del out
    rows = np.load(joined, mmap_mode="r")
    per = len(rows) // len(paths)
    starts = (np.arange(len(paths))[:, None] * per + np.arange(per - LENGTH + 1)).ravel()
    return rows, starts.astype(np.int64)


def _window_view(rows: np.ndarray) -> np.ndarray:
    """Every window of ``rows`` as a read-only strided view ``[starts, L, F]``."""
    return np.lib.stride_tricks.sliding_window_view(rows, LENGTH, axis=0).transpose(0, 2, 1)


def _materialized(source: str) -> np.ndarray:
    """``MATERIALIZED_BATCHES`` batches of windows, uniformly drawn, copied out."""
    rows, starts = _source_rows(source)
    chosen = np.random.default_rng(0).permutation(starts)[:MATERIALIZED_BATCHES * BATCH]
    return np.ascontiguousarray(_window_view(np.asarray(rows))[chosen])


class MemmapBatches:
    """The 30-line peer: a Grain source whose item ``i`` is batch ``i`` of a
    uniform permutation, one fancy index over a ``np.memmap`` of the rows."""

    def __init__(self, source: str, seed: int = 0) -> None:
        rows, starts = _source_rows(source)
        self.windows = _window_view(rows)
        self.order = np.random.default_rng(seed).permutation(starts)

    def __len__(self) -> int:
        return -(-len(self.order) // BATCH)

    def __getitem__(self, i: int) -> np.ndarray:
        return np.array(self.windows[np.sort(self.order[i * BATCH:(i + 1) * BATCH])])


# -- consumers ------------------------------------------------------------------------
def _drain_tf(ds: Any, measure: Measure) -> None:
    """Every batch of ``ds`` inside a ``tf.function`` (the first one outside the clock)."""
    import tensorflow as tf

    @tf.function
    def drain(it: Any, steps: tf.Tensor) -> tf.Tensor:
        n = tf.constant(0, tf.int64)
        for _ in tf.range(steps):
            n += tf.shape(next(it), out_type=tf.int64)[0]
        return n

    it = iter(ds)
    total = int(ds.cardinality())
    drain(it, tf.constant(1, tf.int64))
    measure.start()
    measure.stop(int(drain(it, tf.constant(total - 1, tf.int64))))


def _keras_model(features: int) -> Any:
    import keras

    model = keras.Sequential([keras.Input((LENGTH, features)), keras.layers.Dense(4),
                              keras.layers.Dense(features)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def _trivial_model(features: int) -> Any:
    """A model whose step costs next to nothing (the mean of ``x`` over time,
    then one weight per feature): what the reader's own cost shows under."""
    import keras

    model = keras.Sequential([keras.Input((LENGTH, features)),
                              keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def _fit(data: Any, model: Any, measure: Measure, **fit: Any) -> None:
    """Keras ``fit`` for ``WARMUP + STEPS`` steps, steps after the warm-up timed."""
    import keras

    class Clock(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            if batch == WARMUP:
                measure.start()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if batch == WARMUP + STEPS - 1:
                measure.stop(STEPS * BATCH)

    model.fit(data, epochs=1, verbose=0, callbacks=[Clock()], **fit)


def _torch_loop(batches: Iterable[Any], features: int, measure: Measure) -> None:
    """An SGD step of a small PyTorch model per batch, steps after the warm-up timed."""
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(features, 4), torch.nn.Linear(4, features))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for step, x in enumerate(batches):
        if step == WARMUP:
            measure.start()
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), x).backward()
        optimizer.step()
        if step == WARMUP + STEPS - 1:
            measure.stop(STEPS * BATCH)
            return


def _loop(batches: Iterator[Any], measure: Measure, limit: int | None = None) -> None:
    """Take every batch (the first one outside the clock), touching nothing."""
    next(batches)
    windows = 0
    measure.start()
    for x in batches:
        windows += len(x)
        if limit is not None and windows >= limit:
            break
    measure.stop(windows)


# -- the lines (each in its own process) ----------------------------------------------
def _tf_reader(store: Any, how: str) -> Any:
    if how == "spilled":
        return store.tf_dataset("train", BATCH, shuffle="global", seed=0,
                                memory_budget=SPILL_BUDGET)
    return store.tf_dataset("train", BATCH, shuffle=True, seed=0)


def child_tf_function(store_path: str, source: str, how: str) -> dict[str, Any]:
    import tensorflow as tf

    import windowkit as wk

    tf.constant(0)
    measure, store = Measure(), wk.open_store(store_path)
    if how == "materialized":
        windows = _materialized(source)
        _drain_tf(tf.data.Dataset.from_tensor_slices(windows).batch(BATCH), measure)
        return measure.result(windows.nbytes)
    _drain_tf(_tf_reader(store, how), measure)
    return measure.result(store.read_plan("train").rows_bytes())


def child_fit(store_path: str, source: str, how: str, trivial: bool = False
              ) -> dict[str, Any]:
    """Keras ``fit`` of the small autoencoder (``trivial``: of the trivial
    model, :func:`_trivial_model`) from the reader ``how``."""
    import keras
    import tensorflow as tf

    import windowkit as wk

    tf.constant(0)
    measure, store = Measure(), wk.open_store(store_path)
    features, rows_bytes = store.step_shape[0], store.read_plan("train").rows_bytes()
    model = (_trivial_model if trivial else _keras_model)(features)
    steps = WARMUP + STEPS

    def target(x: Any) -> Any:  # an autoencoder's x, or the trivial model's zero
        return tf.zeros([tf.shape(x)[0], 1]) if trivial else x

    if how == "keras_dataset":
        reader = store.keras_dataset("train", BATCH, shuffle=True, seed=0)

        class Pairs(keras.utils.PyDataset):
            def __len__(self) -> int:
                return steps

            def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
                x = reader[i]
                return x, (np.zeros((len(x), 1), np.float32) if trivial else x)

        _fit(Pairs(), model, measure, shuffle=False)
        return measure.result(rows_bytes)
    if how == "materialized":
        windows = _materialized(source)
        ds, rows_bytes = tf.data.Dataset.from_tensor_slices(windows).batch(BATCH), windows.nbytes
    else:
        ds = _tf_reader(store, how)
    _fit(ds.map(lambda x: (x, target(x))).take(steps), model, measure)
    return measure.result(rows_bytes)


def child_fit_trivial(store_path: str, source: str, how: str) -> dict[str, Any]:
    return child_fit(store_path, source, how, trivial=True)


def child_torch(store_path: str, source: str, how: str) -> dict[str, Any]:
    import torch

    import windowkit as wk

    torch.set_num_threads(2)
    measure, store = Measure(), wk.open_store(store_path)
    features = store.step_shape[0]
    if how == "materialized":
        windows = torch.from_numpy(_materialized(source))
        order = torch.randperm(len(windows), generator=torch.Generator().manual_seed(0))
        batches = (windows[order[i:i + BATCH]] for i in range(0, len(windows), BATCH))
        _torch_loop(batches, features, measure)
        return measure.result(windows.numel() * 4)
    ds = store.torch_dataset("train", BATCH, shuffle=True, seed=0)
    _torch_loop(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0), features,
                measure)
    return measure.result(store.read_plan("train").rows_bytes())


def _grain(source: Any, threads: int) -> Iterator[Any]:
    import grain

    read = grain.ReadOptions(num_threads=threads, prefetch_buffer_size=4 if threads else 0)
    return iter(grain.MapDataset.source(source).to_iter_dataset(read))


def _import_framework(reader: str) -> None:
    """What ``reader`` imports, before the baseline is taken."""
    if reader in ("keras_dataset", "materialized", "default", "spilled"):
        import keras  # noqa: F401
        import tensorflow as tf

        tf.constant(0)
    elif reader in ("grain_batches", "memmap"):
        import grain  # noqa: F401


def child_loop(store_path: str, source: str, how: str) -> dict[str, Any]:
    import windowkit as wk

    name, _, threads = how.partition(":")
    _import_framework(name)
    measure, store = Measure(), wk.open_store(store_path)
    rows_bytes = store.read_plan("train").rows_bytes()
    if name == "np.take":
        rows, starts = _source_rows(source)
        windows = _window_view(np.array(rows))
        order = np.random.default_rng(0).permutation(starts)
        _loop((windows[np.sort(order[i:i + BATCH])] for i in range(0, len(order), BATCH)),
              measure)
    elif name == "keras_dataset":
        reader = store.keras_dataset("train", BATCH, shuffle=True, seed=0)
        _loop((reader[i] for i in range(len(reader))), measure)
    elif name == "materialized":
        import tensorflow as tf

        windows = _materialized(source)
        rows_bytes = windows.nbytes
        _loop(iter(tf.data.Dataset.from_tensor_slices(windows).batch(BATCH)), measure)
    elif name in ("default", "spilled"):
        _loop(iter(_tf_reader(store, name)), measure, MATERIALIZED_BATCHES * BATCH)
    elif name == "grain_batches":
        _loop(_grain(store.grain_batches("train", BATCH, shuffle=True, seed=0), int(threads)),
              measure)
    elif name == "memmap":
        _loop(_grain(MemmapBatches(source), int(threads)), measure)
    return measure.result(rows_bytes)


CHILDREN: dict[str, Callable[[str, str, str], dict[str, Any]]] = {
    "tf.function": child_tf_function, "fit": child_fit, "fit trivial": child_fit_trivial,
    "torch loop": child_torch, "loop": child_loop}


def lines(formats: list[str]) -> list[tuple[str, str, str]]:
    """Every line: (consumer, what, store format)."""
    first = formats[0]
    out = [("tf.function", "materialized", first)]
    out += [("tf.function", "default", f) for f in formats]
    out += [("tf.function", "spilled", first)]
    out += [("fit", how, first) for how in ("materialized", "default", "spilled",
                                            "keras_dataset")]
    out += [("fit trivial", "materialized", first)]
    out += [("fit trivial", "default", f) for f in formats]
    out += [("fit trivial", how, first) for how in ("spilled", "keras_dataset")]
    out += [("torch loop", how, first) for how in ("materialized", "torch_dataset")]
    out += [("loop", "materialized", first)]
    out += [("loop", "default", f) for f in formats]
    out += [("loop", how, first) for how in ("np.take", "keras_dataset", "grain_batches:0",
                                             "grain_batches:1", "memmap:0", "memmap:1")]
    return out


def _child(consumer: str, store: str, source: str, how: str) -> dict[str, Any]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run([sys.executable, "-m", "tests.benchmarks.training", "child",
                           consumer, store, source, how], capture_output=True, text=True,
                          env=env, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"training child {consumer} {how} failed:\n{proc.stderr[-3000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def run(mib: int, formats: list[str], rounds: dict[str, int]) -> dict[str, Any]:
    """Every line, the best of ``rounds[consumer]`` runs (default 1), and the bars."""
    source = OUT / f"beyond-src-{mib}"
    rows = make_source(source, mib)
    for fmt in formats:
        store = OUT / f"beyond-{fmt}-{mib}"
        if not (store / "windowkit.json").exists():
            _run_child("convert_plain", str(source / "s*.npy"), str(store), fmt)
    best: dict[tuple[str, str, str], dict[str, Any]] = {}
    for round_ in range(max(rounds.values())):  # rounds interleaved: load slows all alike
        for consumer, how, fmt in lines(formats):
            if round_ >= rounds.get(consumer, 1):
                continue
            r = _child(consumer, str(OUT / f"beyond-{fmt}-{mib}"), str(source), how)
            key = (consumer, how, fmt)
            if key not in best or r["windows_s"] > best[key]["windows_s"]:
                best[key] = {**r, "consumer": consumer, "reader": how, "format": fmt,
                             "rounds": rounds.get(consumer, 1)}
    results = list(best.values())
    print(f"{'consumer':<12}{'reader':<26}{'windows/s':>11}{'CPU s/M':>9}{'peak+':>9}"
          f"{'anon+':>9}{'rows':>8}")
    for r in results:
        print(f"{r['consumer']:<12}{r['format'] + ' ' + r['reader']:<26}"
              f"{r['windows_s']:>11,.0f}{r['cpu_s_per_m']:>9.2f}{r['peak_over_mb']:>6.0f} MB"
              f"{r['anon_over_mb']:>6.0f} MB{r['rows_mb']:>5.0f} MB")
    measured = bars(results)
    figures = {"mib": mib, "series": SERIES, "rows_per_series": rows, "length": LENGTH,
               "batch": BATCH, "spill_budget_mib": SPILL_BUDGET >> 20, "warmup": WARMUP,
               "steps": STEPS, "rounds": rounds, "lines": results, "bars": measured}
    for text in measured:
        print(text)
    _save("training", **figures)
    return figures


def _line(results: list[dict[str, Any]], consumer: str, reader: str,
          fmt: str | None = None) -> dict[str, Any]:
    return next(r for r in results if r["consumer"] == consumer and r["reader"] == reader
                and (fmt is None or r["format"] == fmt))


def _rate(results: list[dict[str, Any]], consumer: str, reader: str,
          fmt: str | None = None) -> float:
    return float(_line(results, consumer, reader, fmt)["windows_s"])


def bars(results: list[dict[str, Any]]) -> list[str]:
    """The issue's bars, each with its measured figure."""
    formats = list(dict.fromkeys(r["format"] for r in results
                                 if r["consumer"] == "loop" and r["reader"] == "default"))
    fit = _rate(results, "fit", "materialized")
    trivial = _rate(results, "fit trivial", "materialized")
    loop = _rate(results, "loop", "materialized")
    keras_loop = _line(results, "loop", "keras_dataset")
    out = [f"fit, default reader: {_rate(results, 'fit', 'default') / fit:.2f}x materialized "
           "(bar 0.95x)",
           f"fit, spilled: {_rate(results, 'fit', 'spilled') / fit:.2f}x materialized "
           "(bar 0.8x)"]
    for f in formats:
        cpu = _line(results, "loop", "default", f)["cpu_s_per_m"] / keras_loop["cpu_s_per_m"]
        out += [f"{f}: tf_dataset's CPU per window in a loop {cpu:.2f}x keras_dataset's "
                "(bar 1.3x)",
                f"{f}: tf_dataset in a loop {_rate(results, 'loop', 'default', f) / loop:.2f}x "
                "materialized (bar 1.3x)",
                f"{f}: fit of the trivial model from tf_dataset "
                f"{_rate(results, 'fit trivial', 'default', f) / trivial:.2f}x materialized "
                "(bar 0.95x)"]
    for threads in ("0", "1"):
        grain = _rate(results, "loop", f"grain_batches:{threads}")
        out.append(f"grain_batches under Grain ({threads} threads): "
                   f"{grain / keras_loop['windows_s']:.2f}x keras_dataset (bar 0.8x)")
    over = [f"{r['consumer']} {r['reader']}" for r in results
            if r["reader"] not in REFERENCES and r["peak_over_mb"] > r["rows_mb"] + ROWS_SLACK_MB]
    out.append(f"windowkit's peak RSS over the import <= rows held + {ROWS_SLACK_MB} MiB: "
               + ("every line" if not over else "not " + ", ".join(over)))
    return out


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "child":
        consumer, store, source, how = argv[1:5]
        print(json.dumps(CHILDREN[consumer](store, source, how)))
        return
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.training")
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--formats", nargs="+", default=["zarr", "tfrecord", "parquet"])
    parser.add_argument("--rounds", type=int, default=2,
                        help="runs of each line, the best kept (fit lines: one more)")
    args = parser.parse_args(argv)
    rounds = {consumer: args.rounds for consumer in CHILDREN}
    rounds["fit"] = rounds["fit trivial"] = args.rounds + 1  # the bars' lines, the noisiest
    run(args.mib, args.formats, rounds)


if __name__ == "__main__":
    main()
