"""Convergence behind ``make bench-convergence``: does the input order change
what a model learns?

The same small Keras model trains for a fixed number of steps on each input
pipeline, and its validation loss is measured every ``--eval-every``
steps on the same validation windows:

- ``materialized``: every training window in memory (NumPy), a uniform
  permutation each epoch: the reference;
- ``reordered``: as ``materialized`` with another permutation seed: how much
  two uniform orders differ, the noise any comparison with ``materialized``
  has to be read against;
- ``default``: ``store.tf_dataset("train", B, shuffle=True, seed=s)``;
- ``global``: ``shuffle="global"`` with ``memory_budget`` a quarter of the
  split's row bytes (the split does not fit: each batch's windows are read by
  random access from local disk);
- ``none``: ``shuffle=False`` (index order).

Two tasks: an LSTM forecaster of San Francisco's hourly temperatures
(``fixtures/real/sf-temps.csv``), and an LSTM autoencoder that reverses windows
of the ``make bench`` data. Each mode runs with the same seeds (the seed fixes
the model's initial weights and the reader's order). The curves are plotted
into ``docs/img/convergence-<task>.png`` and the figures saved as
``convergence.json`` in ``WINDOWKIT_BENCH_DIR`` (``bench-out/``);
``tests/benchmarks/perf_page.py`` writes them into ``docs/shuffling.md``.

    python -m tests.benchmarks.convergence [--steps N] [--seeds 4] [--rows 5000]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tests.benchmarks.perf_page import CONVERGENCE_MODES

if TYPE_CHECKING:
    import keras

    import windowkit as wk

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "fixtures" / "real"
Batch = tuple[np.ndarray, np.ndarray]
PLOT_LINES = {  # legend and line style of each mode; (c) dashed: it may hide (b)
    "materialized": ("(a) materialized, permuted each epoch", "-"),
    "reordered": ("(a') as (a), another permutation seed", "-."),
    "default": ("(b) shuffle=True", "-"),
    "global": ('(c) shuffle="global", budget < split', "--"),
    "none": ("(d) shuffle=False", ":"),
}


@dataclass(frozen=True)
class Task:
    """One model and its data: ``store`` converts the data (into a directory),
    ``model`` builds the network for a store, ``reverse`` makes the target the
    input reversed in time (else the store's horizon is the target)."""

    name: str
    title: str
    source: str  # the data, for the docs; ``{rows}`` is ``--rows``
    store: Callable[[Path, argparse.Namespace], wk.Store]
    model: Callable[[wk.Store], keras.Model]
    batch: int
    learning_rate: float
    steps: int
    reverse: bool = False


def _forecast_store(out: Path, args: argparse.Namespace) -> wk.Store:
    """sf-temps.csv: one hourly series of 2010 (one missing hour, bridged);
    24 hours in, the next 6 out; the last 20% of the year validates."""
    import windowkit as wk

    return wk.convert(REAL / "sf-temps.csv", out, format=args.format, overwrite=True,
                      compression=args.compression, window=wk.WindowSpec(24, horizon=6),
                      time_col="date", time_format="%Y/%m/%d %H:%M:%S", max_gap="2h",
                      splits={"train": 0.8, "val": 0.2})


def _reverse_store(out: Path, args: argparse.Namespace) -> wk.Store:
    """The ``make bench`` random walks (20 series x 16 float32), their first
    ``--rows`` rows; windows of 32; the last 20% of each series validates."""
    import windowkit as wk
    from tests.benchmarks.benchmark import _make_throughput_data

    source = Path(args.bench_dir) / "throughput-src"
    _make_throughput_data(source)
    series = [np.load(p, mmap_mode="r")[:args.rows].copy() for p in sorted(source.glob("*.npy"))]
    return wk.convert(series, out, format=args.format, compression=args.compression,
                      window=32, splits={"train": 0.8, "val": 0.2}, overwrite=True)


def _forecaster(store: wk.Store) -> keras.Model:
    import keras

    spec, features = store.spec, int(np.prod(store.step_shape))
    return keras.Sequential([
        keras.Input((spec.length, features)),
        keras.layers.LSTM(32),
        keras.layers.Dense(spec.horizon * features),
        keras.layers.Reshape((spec.horizon, features)),
    ])


def _autoencoder(store: wk.Store) -> keras.Model:
    import keras

    length, features = store.spec.length, int(np.prod(store.step_shape))
    return keras.Sequential([
        keras.Input((length, features)),
        keras.layers.LSTM(32),
        keras.layers.RepeatVector(length),
        keras.layers.LSTM(32, return_sequences=True),
        keras.layers.TimeDistributed(keras.layers.Dense(features)),
    ])


TASKS = {
    "forecast": Task("forecast", "LSTM forecaster, San Francisco hourly temperatures",
                     "`fixtures/real/sf-temps.csv` (NOAA, 2010), split by time 80/20",
                     _forecast_store, _forecaster, batch=512, learning_rate=3e-3, steps=600),
    "reverse": Task("reverse", "LSTM autoencoder reversing windows of the bench data",
                    "the `make bench` random walks, the first {rows:,} of 20,000 rows of "
                    "each series, split by time 80/20",
                    _reverse_store, _autoencoder, batch=128, learning_rate=3e-3, steps=500,
                    reverse=True),
}


# -- data: the same windows for every mode ------------------------------------------------
def _pair(task: Task, got: Any) -> Batch:
    """``(x, target)`` as NumPy arrays from a store's ``x`` or ``(x, y)``."""
    x, y = got if isinstance(got, tuple) else (got, None)
    x = np.asarray(x, dtype=np.float32)
    return ((x, np.ascontiguousarray(x[:, ::-1])) if task.reverse
            else (x, np.asarray(y, dtype=np.float32)))


def _materialize(task: Task, store: wk.Store, split: str, limit: int | None = None) -> Batch:
    """The split's windows, normalized, in memory: all, or ``limit`` evenly spaced."""
    n = store.num_windows(split)
    positions = (np.arange(n) if limit is None or limit >= n
                 else np.linspace(0, n - 1, limit).astype(np.int64))
    return _pair(task, store.windows(split, positions, normalize=True))


def _split_bytes(store: wk.Store, split: str) -> int:
    """Bytes of the rows the split's windows lie in."""
    first, end = store.split_rows(split)
    row = int(np.prod(store.step_shape)) * store.dtype.itemsize
    return int((end - first).sum()) * row


def _permuted(data: Batch, batch: int, seed: int) -> Iterator[Batch]:
    """Every window in memory, a new uniform permutation each epoch."""
    rng, (x, y) = np.random.default_rng(seed), data
    while True:
        order = rng.permutation(len(x))
        for i in range(len(x) // batch):
            take = np.sort(order[i * batch:(i + 1) * batch])  # a batch's order is no matter
            yield x[take], y[take]


def _batches(task: Task, store: wk.Store, mode: str, seed: int,
             materialized: Batch | None, budget: int) -> Iterator[Any]:
    """The training batches of ``mode``, epoch after epoch, without end."""
    if mode in ("materialized", "reordered"):
        assert materialized is not None
        yield from _permuted(materialized, task.batch, seed + (mode == "reordered") * 1000)
        return
    modes: dict[str, dict[str, Any]] = {
        "default": {"shuffle": True}, "none": {"shuffle": False},
        "global": {"shuffle": "global", "memory_budget": budget}}
    options = modes[mode]
    ds = store.tf_dataset("train", task.batch, seed=seed, normalize=True, drop_remainder=True,
                          **options)
    while True:  # each iteration of the dataset is a new epoch
        for got in ds:
            if task.reverse:
                yield got, got[:, ::-1]
            else:
                yield got


# -- training ------------------------------------------------------------------------------
class Trainer:
    """One task's model, optimizer and compiled steps, traced once and reset
    to a seed's initial weights (and a fresh optimizer) for each run."""

    def __init__(self, task: Task, store: wk.Store, val: Batch, steps: int) -> None:
        import keras
        import tensorflow as tf

        self.task, self.store, self.steps = task, store, steps
        self.model = task.model(store)
        # decayed to zero at the last step, gradients clipped: the final losses settle
        self.optimizer = keras.optimizers.Adam(
            keras.optimizers.schedules.CosineDecay(task.learning_rate, steps), clipnorm=1.0)
        self.optimizer.build(self.model.trainable_variables)
        val_x, val_y = (tf.constant(v) for v in val)
        mse = keras.losses.MeanSquaredError()
        model, optimizer = self.model, self.optimizer

        @tf.function
        def step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
            with tf.GradientTape() as tape:
                loss = mse(y, model(x, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        @tf.function
        def evaluate() -> tf.Tensor:
            return tf.reduce_mean(tf.square(model(val_x, training=False) - val_y))

        self.step, self.evaluate = step, evaluate

    def reset(self, seed: int) -> None:
        """The initial weights of ``seed`` (the same in every mode), a new optimizer state."""
        import keras

        keras.utils.set_random_seed(seed)
        self.model.set_weights(self.task.model(self.store).get_weights())
        for variable in self.optimizer.variables:  # iterations and moments back to zero
            variable.assign(np.zeros(variable.shape, variable.dtype))

    def run(self, batches: Iterator[Any], seed: int, every: int) -> list[float]:
        """Validation MSE at steps 0, ``every``, ..., ``steps`` of one training run."""
        import tensorflow as tf

        self.reset(seed)
        curve = [float(self.evaluate())]
        for i in range(1, self.steps + 1):
            x, y = next(batches)
            self.step(tf.convert_to_tensor(x), tf.convert_to_tensor(y))
            if i % every == 0:
                curve.append(float(self.evaluate()))
        return curve


def _run_one(trainer: Trainer, batches: Iterator[Any], *, mode: str, seed: int,
             every: int, seconds: dict[str, float]) -> list[float]:
    """One training run, its time added to ``seconds[mode]``; a failure is one
    line naming the run, never a traceback."""
    name, start = trainer.task.name, time.perf_counter()
    try:
        curve = trainer.run(batches, seed, every)
    except Exception as err:
        first = str(err).splitlines()[0] if str(err) else ""
        raise SystemExit(f"convergence: task {name}, mode {mode}, seed {seed}: "
                         f"{type(err).__name__}: {first}") from None
    took = time.perf_counter() - start
    seconds[mode] = seconds.get(mode, 0.0) + took
    print(f"  {name:<9}{mode:<13}seed {seed}: val MSE {curve[0]:.4f} -> {curve[-1]:.4f} "
          f"({took:.0f} s)", flush=True)
    return curve


def _run_task(task: Task, args: argparse.Namespace) -> dict[str, Any]:
    """Every mode and seed of one task: the curves and the final losses."""
    start = time.perf_counter()
    steps = args.steps or task.steps
    if steps % args.eval_every:
        raise SystemExit(f"convergence: task {task.name} trains {steps} steps, "
                         f"not a multiple of --eval-every {args.eval_every}")
    store = task.store(Path(args.bench_dir) / f"convergence-{task.name}", args)
    val = _materialize(task, store, "val", args.val_windows)
    train = (_materialize(task, store, "train")
             if {"materialized", "reordered"} & set(args.modes) else None)
    split_bytes = _split_bytes(store, "train")
    budget = max(1, split_bytes // 4)
    trainer, run_seconds = Trainer(task, store, val, steps), dict[str, float]()
    curves = {mode: {str(seed): _run_one(trainer, _batches(task, store, mode, seed, train,
                                                           budget),
                                         mode=mode, seed=seed, every=args.eval_every,
                                         seconds=run_seconds)
                     for seed in range(args.seeds)} for mode in args.modes}
    return _summary(task, store, args, curves, split_bytes=split_bytes, budget=budget,
                    steps=list(range(0, steps + 1, args.eval_every)),
                    run_seconds=run_seconds, seconds=time.perf_counter() - start)


def _summary(task: Task, store: wk.Store, args: argparse.Namespace,
             curves: dict[str, dict[str, list[float]]], **more: Any) -> dict[str, Any]:
    """A task's figures: the final loss of each run is the mean of its last
    ``--final`` evaluations; per mode, the mean over seeds, its ratio to
    ``materialized``, and the spread over seeds (standard deviation / mean)."""
    finals = {m: [float(np.mean(c[-args.final:])) for c in runs.values()]
              for m, runs in curves.items()}
    final = {m: float(np.mean(v)) for m, v in finals.items()}
    ref = final.get("materialized")
    spec = store.spec
    return {"title": task.title, "source": task.source.format(rows=args.rows),
            "curves": curves, "final_seeds": finals, "final": final,
            "ratio": {m: v / ref for m, v in final.items()} if ref else {},
            "spread": {m: float(np.std(v) / np.mean(v)) for m, v in finals.items()},
            "batch": task.batch, "learning_rate": task.learning_rate,
            "window": spec.length, "horizon": spec.horizon,
            "features": int(np.prod(store.step_shape)),
            "series": int(store.manifest.series.count),
            "train_windows": store.num_windows("train"),
            "val_windows": min(store.num_windows("val"), args.val_windows),
            "format": args.format, "image": f"img/convergence-{task.name}.png", **more}


# -- output --------------------------------------------------------------------------------
def _plot(name: str, fig: dict[str, Any], path: Path) -> None:
    """The validation curves of one task: per mode the mean over seeds, shaded
    between the lowest and highest seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = np.asarray(fig["steps"])
    figure, ax = plt.subplots(figsize=(7, 4), dpi=100)
    for mode, runs in fig["curves"].items():
        values = np.asarray(list(runs.values()))
        label, style = PLOT_LINES[mode]
        line, = ax.plot(steps, values.mean(axis=0), style, label=label, lw=1.6)
        ax.fill_between(steps, values.min(axis=0), values.max(axis=0),
                        color=line.get_color(), alpha=0.18, lw=0)
    ax.set_yscale("log")
    ax.set_xlabel("training step")
    ax.set_ylabel("validation MSE (normalized)")
    ax.set_title(f"{fig['title']}\n{len(next(iter(fig['curves'].values())))} seeds, "
                 f"batch {fig['batch']}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)


def _save(bench_dir: Path, figures: dict[str, Any]) -> Path:
    """``convergence.json`` beside the other parts' figures (as ``benchmark._save``)."""
    bench_dir.mkdir(parents=True, exist_ok=True)
    figures.update(cores=os.cpu_count(), date=time.strftime("%Y-%m-%d", time.gmtime()))
    path = bench_dir / "convergence.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(figures, indent=1))
    tmp.replace(path)
    return path


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.convergence",
                                     description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=None,
                        help="training steps per run (default: the task's, "
                        + ", ".join(f"{t.name} {t.steps}" for t in TASKS.values()) + ")")
    parser.add_argument("--eval-every", type=int, default=50, help="steps between evaluations")
    parser.add_argument("--final", type=int, default=3,
                        help="the last evaluations averaged into a run's final loss")
    parser.add_argument("--seeds", type=int, default=4, help="runs per mode (seeds 0..N-1)")
    parser.add_argument("--rows", type=int, default=5000,
                        help="rows of each bench series the autoencoder uses (of 20,000)")
    parser.add_argument("--val-windows", type=int, default=2048,
                        help="validation windows (evenly spaced over the split)")
    parser.add_argument("--tasks", nargs="+", choices=list(TASKS), default=list(TASKS))
    parser.add_argument("--modes", nargs="+", choices=list(CONVERGENCE_MODES),
                        default=list(CONVERGENCE_MODES))
    parser.add_argument("--format", default="zarr", help="the stores' format")
    parser.add_argument("--compression", default=None,
                        help="the stores' compression (default: the format's)")
    parser.add_argument("--bench-dir", type=Path,
                        default=Path(os.environ.get("WINDOWKIT_BENCH_DIR", "bench-out")))
    parser.add_argument("--img-dir", type=Path, default=ROOT / "docs" / "img")
    args = parser.parse_args(argv)
    if args.steps is not None and (args.steps < 1 or args.eval_every < 1
                                   or args.steps % args.eval_every):
        parser.error("--steps must be a positive multiple of --eval-every")
    if min(args.eval_every, args.seeds, args.final, args.val_windows) < 1 or args.rows < 100:
        parser.error("--eval-every, --seeds, --final and --val-windows must be positive, "
                     "--rows at least 100")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = _args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    start = time.perf_counter()
    tasks = {}
    for name in args.tasks:
        tasks[name] = _run_task(TASKS[name], args)
        _plot(name, tasks[name], args.img_dir / f"convergence-{name}.png")
    figures = {"tasks": tasks, "seeds": args.seeds, "eval_every": args.eval_every,
               "final_evaluations": args.final, "rows": args.rows,
               "seconds": time.perf_counter() - start}
    path = _save(args.bench_dir, figures)
    print(f"convergence: final validation MSE, mean of the last {args.final} evaluations "
          f"and {args.seeds} seeds; {figures['seconds']:.0f} s; figures in {path}")
    for name, fig in tasks.items():
        print(f"  {name:<9}" + "  ".join(
            f"{m} {v:.4f} ({fig['ratio'].get(m, float('nan')):.3f}x)"
            for m, v in fig["final"].items()))
    return figures


if __name__ == "__main__":
    main()
