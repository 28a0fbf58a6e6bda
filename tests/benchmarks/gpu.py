"""Training on a GPU fed by each reader, side by side in one run (``make bench-gpu``).

A store of ``--mib`` MiB of rows (default 128: 20 series x 16 float32
features, uncompressed, windows of 32; ``--formats zarr`` by default, name more
to add them) feeds the reversed-window LSTM autoencoder of
``make bench-convergence`` (input a window, target the window reversed in
time; the Keras model is ``tests.benchmarks.convergence._autoencoder``, the
torch model the same layers in ``torch.nn``), trained with Adam, batch 256,
normalized windows, shuffled (``shuffle=True``). Each line runs in its own
process:

- ``tf_dataset``: ``store.tf_dataset(..., device="/GPU:0")``, batches
  prefetched into GPU memory, a ``tf.function`` train step;
- ``keras_dataset, custom loop``: ``ds[i]`` (one worker, in the loop's thread,
  as Keras' ``workers=1`` reads), copied to the GPU with ``tf.identity``;
- ``keras_dataset, model.fit``: the same dataset through ``model.fit`` (as
  ``(x, x)`` pairs, the loss reversing the target): steps/s only;
- ``torch_dataset``: ``DataLoader(ds, batch_size=None, sampler=ds.sampler(),
  num_workers=--torch-workers, pin_memory=True)`` and
  ``x.to("cuda", non_blocking=True)`` (skipped, with the reason printed, when
  ``torch.cuda.is_available()`` is false, as for the CPU build of torch that
  ``make install`` installs);
- the ceilings, ``materialized on the GPU`` (TensorFlow, and torch with CUDA):
  ``--ceiling-windows`` windows copied to the GPU once, each batch a gather
  of random indices on the GPU: no reader at all.

How it measures: ``--warmup`` steps (tracing, pipeline start, cuDNN
autotuning), then ``--steps`` timed steps. In each timed step, the time
blocked in getting the next batch (``next(iterator)``, plus the host-to-device
copy for ``keras_dataset`` and torch) is counted apart from the train step.
The GPU runs asynchronously, so the loop synchronises every 10 steps and at
the end (``loss.numpy()`` / ``loss.item()``): time the GPU spends computing
shows up in the train step or the synchronisation, time the reader keeps the
GPU waiting shows up in ``next``. Reported: steps/s and windows/s over the
timed steps, the input-wait share (time blocked getting batches / total time
of the timed steps), and steps/s as a ratio of the same framework's ceiling.
``model.fit`` is timed by a callback that calls
``tf.test.experimental.sync_devices()`` at the first and last timed batch;
its input wait cannot be told apart inside ``fit``. The whole run takes under
5 minutes on one H100 with 16 cores. The table is printed and saved with the
GPU's name as ``gpu.json`` in ``WINDOWKIT_BENCH_DIR`` (``bench-out/``).

Without a CUDA GPU (neither TensorFlow nor torch sees one) it prints one line,
``bench-gpu: no CUDA GPU on this machine; skipped``, and exits 0 before
building anything. ``--allow-cpu`` (for development; hidden from ``--help``)
runs the same code on the CPU (``/CPU:0``, ``cpu``) with a small store and a
few steps, and saves ``gpu-dryrun.json`` instead.

    python -m tests.benchmarks.gpu [--mib 128] [--formats zarr tfrecord] [--steps 400]
    python -m tests.benchmarks.gpu --allow-cpu      # dry run of the same code on the CPU
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from itertools import count
from pathlib import Path
from typing import Any

import numpy as np

from tests.benchmarks.benchmark import LENGTH, OUT, _run_child, _save
from tests.benchmarks.beyond_memory import FEATURES, SERIES, make_source

SKIPPED = "bench-gpu: no CUDA GPU on this machine; skipped"
SYNC_EVERY = 10  # timed steps between synchronisations with the GPU
LEARNING_RATE = 3e-3
CHILD_TIMEOUT_S = 240
GPU_DEFAULTS = {"mib": 128, "steps": 400, "warmup": 40, "ceiling_windows": 65_536,
                "torch_workers": 4}
CPU_DEFAULTS = {"mib": 4, "steps": 12, "warmup": 3, "ceiling_windows": 2048,
                "torch_workers": 1}


def _quiet_tf() -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def gpu_present() -> tuple[bool, bool]:
    """Whether TensorFlow sees a GPU, and whether torch has CUDA (False when
    either is not installed)."""
    _quiet_tf()
    try:
        import tensorflow as tf

        tf_gpu = bool(tf.config.list_physical_devices("GPU"))
    except ImportError:
        tf_gpu = False
    try:
        import torch

        torch_gpu = bool(torch.cuda.is_available())
    except ImportError:
        torch_gpu = False
    return tf_gpu, torch_gpu


def gpu_name() -> str:
    """The first GPU's name, from ``nvidia-smi``, else from TensorFlow or torch."""
    try:
        proc = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30, check=False)
        if proc.returncode == 0 and proc.stdout.strip():
            return proc.stdout.strip().splitlines()[0]
    except (OSError, subprocess.TimeoutExpired):
        pass
    try:
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")
        if gpus:
            return str(tf.config.experimental.get_device_details(gpus[0]).get("device_name"))
        import torch

        if torch.cuda.is_available():
            return str(torch.cuda.get_device_name(0))
    except ImportError:
        pass
    return "unknown"


# -- the timed loop (children) ---------------------------------------------------------
def _timed_loop(next_batch: Callable[[], Any], step: Callable[[Any], Any],
                sync: Callable[[Any], Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """``warmup`` steps, then ``steps`` timed ones: the time in ``next_batch``
    (the input wait) counted apart from the train step; the device synchronised
    every ``SYNC_EVERY`` steps and at the end (``sync(loss)``)."""
    loss = None
    for _ in range(cfg["warmup"]):
        loss = step(next_batch())
    sync(loss)
    steps, wait, start = cfg["steps"], 0.0, time.perf_counter()
    for i in range(steps):
        before = time.perf_counter()
        batch = next_batch()
        wait += time.perf_counter() - before
        loss = step(batch)
        if (i + 1) % SYNC_EVERY == 0:
            sync(loss)
    last = float(sync(loss))
    total = time.perf_counter() - start
    return {"steps_s": steps / total, "windows_s": steps * cfg["batch"] / total,
            "wait_share": wait / total, "step_ms": 1e3 * total / steps,
            "wait_ms": 1e3 * wait / steps, "seconds": total, "loss": last}


def _ceiling_windows(store: Any, limit: int) -> np.ndarray:
    """``limit`` evenly spaced training windows, normalized: ``[n, L, F]`` float32."""
    n = store.num_windows("train")
    positions = np.linspace(0, n - 1, min(n, limit)).astype(np.int64)
    got = store.windows("train", positions, normalize=True)
    return np.ascontiguousarray(got[0] if isinstance(got, tuple) else got, dtype=np.float32)


# -- TensorFlow and Keras (children) ---------------------------------------------------
def _tf_model(cfg: dict[str, Any]) -> tuple[Any, Any, Callable[[Any], Any]]:
    """The store, the convergence benchmark's autoencoder and a ``tf.function``
    train step (target: the window reversed in time)."""
    import tensorflow as tf

    for gpu in tf.config.list_physical_devices("GPU"):
        tf.config.experimental.set_memory_growth(gpu, True)  # the data's buffers need room
    import keras

    import windowkit as wk
    from tests.benchmarks.convergence import _autoencoder

    store = wk.open_store(cfg["store"])
    keras.utils.set_random_seed(0)
    with tf.device(cfg["device"]):
        model = _autoencoder(store)
        optimizer = keras.optimizers.Adam(LEARNING_RATE)
        optimizer.build(model.trainable_variables)

    @tf.function
    def step(x: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(x[:, ::-1] - model(x, training=True)))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    return store, model, step


def _tf_sync(loss: Any) -> float:
    return float(loss.numpy())


def child_tf(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """``tf_dataset(..., device=cfg["device"])``: batches prefetched into its memory."""
    store, _, step = _tf_model(cfg)
    ds = store.tf_dataset("train", cfg["batch"], shuffle=True, seed=0, normalize=True,
                          drop_remainder=True, device=cfg["device"])

    def epochs() -> Iterator[Any]:
        while True:  # each pass over the dataset is the next epoch
            yield from ds

    batches = epochs()
    row = _timed_loop(lambda: next(batches), step, _tf_sync, cfg)
    return [{"reader": f'tf_dataset, device="{cfg["device"]}"', **row}]


def child_tf_ceiling(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """Windows materialized in the device's memory once; a batch a gather of
    random indices there."""
    import tensorflow as tf

    store, _, step = _tf_model(cfg)
    host = _ceiling_windows(store, cfg["ceiling_windows"])
    with tf.device(cfg["device"]):
        windows = tf.identity(tf.constant(host))

    @tf.function
    def take() -> tf.Tensor:
        with tf.device(cfg["device"]):
            picks = tf.random.uniform([cfg["batch"]], maxval=len(host), dtype=tf.int64)
            return tf.gather(windows, picks)

    row = _timed_loop(take, step, _tf_sync, cfg)
    return [{"reader": f"materialized on {cfg['device']} (ceiling)", "windows": len(host),
             "ceiling": True, **row}]


def _pairs(ds: Any) -> Any:
    """``ds``'s batches as ``(x, x)`` without end (``model.fit`` needs a target;
    the loss reverses it), read in Keras' loop as ``ds`` is."""
    import keras

    class Pairs(keras.utils.PyDataset):
        def __init__(self) -> None:
            super().__init__(workers=ds.workers, use_multiprocessing=ds.use_multiprocessing)

        @property
        def num_batches(self) -> int | None:
            return None  # endless: fit runs steps_per_epoch steps

        def __getitem__(self, i: int) -> tuple[Any, Any]:
            x = ds[i % len(ds)]
            return x, x

    return Pairs()


def _fit_rate(model: Any, ds: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    """Steps/s of ``model.fit`` over ``steps`` steps after ``warmup``, timed by
    a callback that synchronises the devices at the first and last timed batch."""
    import keras
    import tensorflow as tf

    marks: list[float] = []
    timed = (cfg["warmup"], cfg["warmup"] + cfg["steps"])

    class Clock(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            if batch in timed:
                tf.test.experimental.sync_devices()
                marks.append(time.perf_counter())

    def reversed_mse(y_true: Any, y_pred: Any) -> Any:
        return tf.reduce_mean(tf.square(y_true[:, ::-1] - y_pred), axis=-1)

    model.compile(optimizer=keras.optimizers.Adam(LEARNING_RATE), loss=reversed_mse)
    history = model.fit(_pairs(ds), epochs=1, steps_per_epoch=timed[1] + 1, verbose=0,
                        shuffle=False, callbacks=[Clock()])
    total = marks[1] - marks[0]
    return {"steps_s": cfg["steps"] / total, "windows_s": cfg["steps"] * cfg["batch"] / total,
            "seconds": total, "step_ms": 1e3 * total / cfg["steps"],
            "loss": float(history.history["loss"][-1])}


def child_keras(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """``keras_dataset``: in a custom loop (``ds[i]`` and the copy to the device
    timed as the wait), then through ``model.fit``."""
    import tensorflow as tf

    store, model, step = _tf_model(cfg)
    ds = store.keras_dataset("train", cfg["batch"], shuffle=True, seed=0, normalize=True,
                             drop_remainder=True)
    position = count()

    def next_batch() -> Any:
        x = ds[next(position) % len(ds)]
        with tf.device(cfg["device"]):
            return tf.identity(x)

    loop = _timed_loop(next_batch, step, _tf_sync, cfg)
    fit = _fit_rate(model, ds, cfg)
    return [{"reader": "keras_dataset, custom loop", **loop},
            {"reader": "keras_dataset, model.fit", **fit}]


# -- torch (children) ------------------------------------------------------------------
def _torch_model(cfg: dict[str, Any]) -> tuple[Any, Any, Callable[[Any], Any]]:
    """The store, the device, and a train step of the same autoencoder in
    ``torch.nn``: LSTM(32) over the window, its last state repeated L times,
    LSTM(32) returning sequences, a Dense per step."""
    import torch

    import windowkit as wk

    class Autoencoder(torch.nn.Module):
        def __init__(self, features: int) -> None:
            super().__init__()
            self.encode = torch.nn.LSTM(features, 32, batch_first=True)
            self.decode = torch.nn.LSTM(32, 32, batch_first=True)
            self.out = torch.nn.Linear(32, features)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            _, (state, _) = self.encode(x)
            repeated = state[-1].unsqueeze(1).expand(-1, x.shape[1], -1)
            return self.out(self.decode(repeated)[0])

    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    store, device = wk.open_store(cfg["store"]), torch.device(cfg["torch_device"])
    model = Autoencoder(int(np.prod(store.step_shape))).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)

    def step(x: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        loss = torch.mean(torch.square(model(x) - x.flip(1)))
        loss.backward()
        optimizer.step()
        return loss.detach()

    return store, device, step


def child_torch(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """``torch_dataset`` through a ``DataLoader`` with workers and pinned memory,
    each batch copied with ``non_blocking=True`` (the copy counted as wait)."""
    import torch

    store, device, step = _torch_model(cfg)
    ds = store.torch_dataset("train", cfg["batch"], shuffle=True, seed=0, normalize=True,
                             drop_remainder=True)
    workers, cuda = cfg["torch_workers"], device.type == "cuda"
    loader = torch.utils.data.DataLoader(ds, batch_size=None, sampler=ds.sampler(),
                                         num_workers=workers, pin_memory=cuda,
                                         persistent_workers=workers > 0)

    def epochs() -> Iterator[Any]:
        for epoch in count():
            ds.set_epoch(epoch)
            yield from loader

    batches = epochs()
    row = _timed_loop(lambda: next(batches).to(device, non_blocking=True), step,
                      lambda loss: loss.item(), cfg)
    return [{"reader": f"torch_dataset, {workers} workers"
             + (", pin_memory" if cuda else ""), **row}]


def child_torch_ceiling(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """Windows materialized in the device's memory once, batches by random index there."""
    import torch

    store, device, step = _torch_model(cfg)
    windows = torch.from_numpy(_ceiling_windows(store, cfg["ceiling_windows"])).to(device)
    n, batch = len(windows), cfg["batch"]

    def take() -> torch.Tensor:
        return windows[torch.randint(n, (batch,), device=device)]

    row = _timed_loop(take, step, lambda loss: loss.item(), cfg)
    return [{"reader": f"materialized on {device} (ceiling)", "windows": n,
             "ceiling": True, **row}]


CHILDREN: dict[str, Callable[[dict[str, Any]], list[dict[str, Any]]]] = {
    "tf": child_tf, "tf_ceiling": child_tf_ceiling, "keras": child_keras,
    "torch": child_torch, "torch_ceiling": child_torch_ceiling,
}


# -- the driver ------------------------------------------------------------------------
def _child(name: str, cfg: dict[str, Any], framework: str, fmt: str) -> list[dict[str, Any]]:
    """One child in a fresh interpreter; its rows, or one row with its error."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    base = {"framework": framework, "format": fmt}
    try:
        proc = subprocess.run([sys.executable, "-m", "tests.benchmarks.gpu", "child", name,
                               json.dumps(cfg)], capture_output=True, text=True, env=env,
                              timeout=CHILD_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return [{**base, "reader": name, "error": f"timed out after {CHILD_TIMEOUT_S} s"}]
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
        print(proc.stderr[-3000:], file=sys.stderr)
        error = lines[-1] if lines else f"exit status {proc.returncode}"
        return [{**base, "reader": name, "error": error}]
    return [{**base, **row} for row in json.loads(proc.stdout.strip().splitlines()[-1])]


def _stores(args: argparse.Namespace) -> dict[str, Path]:
    """The source (``beyond_memory.make_source``) and one uncompressed store per format."""
    source = OUT / f"gpu-src-{args.mib}"
    make_source(source, args.mib)
    stores = {}
    for fmt in args.formats:
        store = stores[fmt] = OUT / f"gpu-{fmt}-{args.mib}"
        if not (store / "windowkit.json").exists():
            _run_child("convert_plain", str(source / "*.npy"), str(store), fmt)
    return stores


def _measure(args: argparse.Namespace, tf_ok: bool, torch_ok: str | None
             ) -> list[dict[str, Any]]:
    """Every line, ceilings first; ``torch_ok`` is the torch device, or ``None``."""
    stores = _stores(args)
    cfg = {"batch": args.batch, "steps": args.steps, "warmup": args.warmup,
           "ceiling_windows": args.ceiling_windows, "torch_workers": args.torch_workers,
           "device": "/GPU:0" if not args.cpu else "/CPU:0", "torch_device": torch_ok}
    first = args.formats[0]
    rows: list[dict[str, Any]] = []
    plan = ([("tf_ceiling", "tensorflow", first)] if tf_ok else []) + (
        [("torch_ceiling", "torch", first)] if torch_ok else [])
    for fmt in args.formats:
        plan += [("tf", "tensorflow", fmt), ("keras", "tensorflow", fmt)] if tf_ok else []
        plan += [("torch", "torch", fmt)] if torch_ok else []
    for name, framework, fmt in plan:
        got = _child(name, {**cfg, "store": str(stores[fmt])}, framework, fmt)
        rows += got
        for row in got:
            print(f"  {framework:<11}{fmt:<9}{row['reader']}: "
                  + (row["error"] if "error" in row else f"{row['steps_s']:,.1f} steps/s"),
                  flush=True)
    return rows


def _table(rows: list[dict[str, Any]]) -> None:
    """The figures, each line's steps/s also as a ratio of its framework's ceiling."""
    ceilings = {r["framework"]: r["steps_s"] for r in rows if r.get("ceiling")}
    print(f"{'framework':<12}{'format':<9}{'reader':<44}{'steps/s':>9}{'windows/s':>12}"
          f"{'ms/step':>9}{'input wait':>12}{'vs ceiling':>12}")
    for r in rows:
        head = f"{r['framework']:<12}{r['format'] if not r.get('ceiling') else '-':<9}"
        if "error" in r:
            print(f"{head}{r['reader']:<44}failed: {r['error']}")
            continue
        wait = f"{100 * r['wait_share']:.1f}%" if "wait_share" in r else "n/a"
        ceiling = ceilings.get(r["framework"])
        ratio = f"{r['steps_s'] / ceiling:.2f}x" if ceiling else "n/a"
        r["vs_ceiling"] = r["steps_s"] / ceiling if ceiling else None
        print(f"{head}{r['reader']:<44}{r['steps_s']:>9,.1f}{r['windows_s']:>12,.0f}"
              f"{r['step_ms']:>9.2f}{wait:>12}{ratio:>12}")


def run(args: argparse.Namespace, tf_ok: bool, torch_ok: str | None, skipped: list[str]
        ) -> dict[str, Any]:
    """Build the stores, run every line, print the table and save the figures."""
    start = time.perf_counter()
    name = "cpu (--allow-cpu dry run)" if args.cpu else gpu_name()
    print(f"bench-gpu on {name}, {os.cpu_count()} cores: {args.mib} MiB store "
          f"({SERIES} series x {FEATURES} float32, uncompressed), L={LENGTH}, "
          f"batch {args.batch}, {args.warmup} warm-up + {args.steps} timed steps per line; "
          f"formats {', '.join(args.formats)}", flush=True)
    for reason in skipped:
        print(f"  skipped: {reason}")
    rows = _measure(args, tf_ok, torch_ok)
    _table(rows)
    print("input wait: time blocked getting the next batch (and copying it to the device) "
          f"/ time of the timed steps, synchronised every {SYNC_EVERY} steps; vs ceiling: "
          "steps/s over the same framework's materialized-on-device line; model.fit: the "
          "wait is inside fit (n/a)")
    figures = {"gpu": name, "mib": args.mib, "series": SERIES, "features": FEATURES,
               "length": LENGTH, "batch": args.batch, "steps": args.steps,
               "warmup": args.warmup, "sync_every": SYNC_EVERY, "formats": args.formats,
               "torch_workers": args.torch_workers, "ceiling_windows": args.ceiling_windows,
               "skipped": skipped, "rows": rows, "seconds": time.perf_counter() - start}
    _save("gpu-dryrun" if args.cpu else "gpu", **figures)
    print(f"bench-gpu: {figures['seconds']:.0f} s; figures in "
          f"{OUT / ('gpu-dryrun.json' if args.cpu else 'gpu.json')}")
    return figures


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.gpu",
                                     description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--mib", type=int, help="MiB of rows in the store (default 128)")
    parser.add_argument("--formats", nargs="+", default=["zarr"], help="store formats")
    parser.add_argument("--steps", type=int, help="timed steps per line (default 400)")
    parser.add_argument("--warmup", type=int, help="warm-up steps per line (default 40)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--ceiling-windows", type=int,
                        help="windows materialized on the GPU for the ceiling (default 65536)")
    parser.add_argument("--torch-workers", type=int, help="DataLoader workers (default 4)")
    parser.add_argument("--allow-cpu", dest="cpu", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for key, value in (CPU_DEFAULTS if args.cpu else GPU_DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if min(args.mib, args.steps, args.batch, args.ceiling_windows) < 1 or args.warmup < 1:
        parser.error("--mib, --steps, --warmup, --batch and --ceiling-windows must be positive")
    return args


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    _quiet_tf()
    if argv[:1] == ["child"]:
        print(json.dumps(CHILDREN[argv[1]](json.loads(argv[2]))))
        return
    args = _args(argv)
    tf_gpu, torch_gpu = gpu_present()
    if not (tf_gpu or torch_gpu or args.cpu):
        print(SKIPPED)
        return
    skipped = []
    if not (tf_gpu or args.cpu):
        skipped.append("tensorflow: tf.config.list_physical_devices('GPU') is empty")
    if not (torch_gpu or args.cpu):
        skipped.append("torch: torch.cuda.is_available() is False" + _torch_build())
    torch_ok = (("cpu" if _has_torch() else None) if args.cpu
                else ("cuda" if torch_gpu else None))
    run(args, tf_gpu or args.cpu, torch_ok, skipped)


def _has_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def _torch_build() -> str:
    """`` (torch <version>)``, or that torch is not installed."""
    try:
        import torch
    except ImportError:
        return " (torch is not installed)"
    return f" (torch {torch.__version__})"


if __name__ == "__main__":
    main()
