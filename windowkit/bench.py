"""``windowkit bench``: how fast a store feeds training, and where the time goes.

The reader runs for a few warm-up batches (at most a quarter of an epoch, so
that a small split is timed too), then is timed batch by batch the way a
training loop consumes it, epoch after epoch when more batches are asked for
than an epoch holds. A batch is whatever the reader yields: an array, or a
dict of fields (``inputs``, ``future_known``, ``static``, ``series``), with
its targets; its bytes are those of every part. Its stages are then timed
alone on the same store: *read + decode* (the storage blocks the epoch needs,
as the reader loads them) and *gather* (cutting batches of windows from
blocks already in memory). ``baseline=True`` also runs, in the same process on the same
windows, the plain approach: every window materialized in memory,
``shuffle(10000).batch(B)``.

How well batches are mixed is measured exactly, on the reader's own pipeline:
run once more over a stand-in for the store whose rows hold their own row
numbers (nothing is read), each batch says which windows it holds; its
distinct series and storage blocks are reported next to those of a uniform
permutation of the same windows.
"""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from windowkit.errors import InvalidSpecError, WindowkitError
from windowkit.formats import RowReader
from windowkit.readers.options import BatchOptions, ShuffleOptions
from windowkit.readers.plan import StoreAccess

if TYPE_CHECKING:
    from windowkit.store import Store

READERS = ("tf", "keras")
#: ``shuffle`` spelt as the readers' ``shuffle=`` argument (``true``: the default)
SHUFFLES: dict[str, bool | str] = {"true": True, "global": "global", "blocks": "blocks",
                                   "false": False}
EARLIER_SHUFFLES = {"default": "true", "none": "false"}  # earlier spellings, still taken


def shuffle_word(shuffle: str) -> str:
    """``shuffle`` as :data:`SHUFFLES` spells it (earlier spellings taken); else one line."""
    word = EARLIER_SHUFFLES.get(shuffle, shuffle)
    if word not in SHUFFLES:
        raise InvalidSpecError(f"shuffle must be one of {', '.join(SHUFFLES)}, got {shuffle!r}")
    return word
PLAIN_SHUFFLE_BUFFER = 10_000
GATHER_BATCHES = 200  # batches timed by the gather-alone stage


def peak_rss_mb() -> float:
    """This process's peak resident set size in MB (``getrusage``: kilobytes on
    Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def _available_bytes() -> int:
    """Memory available to new allocations without swapping (psutil)."""
    import psutil

    return int(psutil.virtual_memory().available)


@dataclass
class Stage:
    """One stage's timing: ``spans`` are each element's (start, end) seconds."""

    name: str
    seconds: float
    windows: int
    bytes: int
    spans: list[tuple[float, float]] = field(default_factory=list)

    @property
    def windows_s(self) -> float:
        return self.windows / self.seconds if self.seconds > 0 else float("nan")

    @property
    def mb_s(self) -> float:
        return self.bytes / self.seconds / 1e6 if self.seconds > 0 else float("nan")


@dataclass
class Mixing:
    """Distinct series and storage blocks per batch, averaged over one epoch's
    full batches: the reader's, and a uniform permutation's of the same windows."""

    series: float
    blocks: float
    uniform_series: float
    uniform_blocks: float


@dataclass
class BenchReport:
    store: str
    format: str
    reader: str
    shuffle: str
    split: str
    batch_size: int
    window_bytes: int
    run: Stage  # the reader, as training consumes it
    peak_rss_mb: float
    stages: list[Stage]
    mixing: Mixing | None = None
    baseline: dict[str, Any] | None = None
    batches_per_epoch: int = 0  # the reader's batches in one epoch of the split
    warmup: int = 0  # batches read before timing
    warmup_asked: int = 0  # warm-up batches asked for (more than a small split allows)
    epochs: int = 1  # epochs the run started, warm-up included
    notes: list[str] = field(default_factory=list)  # what was not measured, and why
    mode: str = ""  # what the shuffle does on this split (uniform in memory, ...)
    memory_budget: int = 0  # bytes the reader may hold

    @property
    def ratio(self) -> float | None:
        if not self.baseline or "windows_s" not in self.baseline:
            return None
        return float(self.run.windows_s / self.baseline["windows_s"])

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for stage in [out["run"], *out["stages"]]:
            del stage["spans"]
        for stage, raw in zip([out["run"], *out["stages"]], [self.run, *self.stages],
                              strict=True):
            stage["windows_s"] = raw.windows_s
            stage["mb_s"] = raw.mb_s
        out["ratio_to_baseline"] = self.ratio
        return out


# -- timing ------------------------------------------------------------------------------
def _time_elements(items: Any, limit: int | None, size: Any) -> Stage:
    """Time pulling elements of ``items``; ``size(element) -> (windows, bytes)``."""
    spans: list[tuple[float, float]] = []
    windows = nbytes = 0
    it = iter(items)
    origin = time.perf_counter()
    while limit is None or len(spans) < limit:
        t0 = time.perf_counter()
        try:
            element = next(it)
        except StopIteration:
            break
        t1 = time.perf_counter()
        spans.append((t0 - origin, t1 - origin))
        w, b = size(element)
        windows += w
        nbytes += b
    seconds = spans[-1][1] if spans else 0.0
    return Stage("", seconds, windows, nbytes, spans)


def _leaves(batch: Any) -> list[Any]:
    """The arrays of a batch: ``x`` (an array, or a dict of fields) and ``y``."""
    if isinstance(batch, dict):
        return [leaf for value in batch.values() for leaf in _leaves(value)]
    if isinstance(batch, (tuple, list)):
        return [leaf for value in batch for leaf in _leaves(value)]
    return [batch]


def _nbytes(array: Any) -> int:
    """Bytes of a NumPy array or a tensor."""
    dtype = array.dtype
    itemsize = dtype.itemsize if isinstance(dtype, np.dtype) else dtype.size
    return int(np.prod(tuple(array.shape), dtype=np.int64)) * int(itemsize)


def _batch_size_of(batch: Any) -> tuple[int, int]:
    """Windows in a batch, and the bytes of all its fields (inputs, known-future
    values, static features, series ids, targets)."""
    leaves = _leaves(batch)
    return int(leaves[0].shape[0]), sum(_nbytes(leaf) for leaf in leaves)


def _window_bytes(store: Store) -> int:
    """Bytes of one window's rows (all features, inputs and horizon): the
    estimate used before any batch was read."""
    return (store.spec.length + store.spec.horizon) * store.layout.row_bytes


class _Epochs:
    """A reader's batches over as many epochs as are pulled: a ``tf.data``
    dataset iterated again (each iteration is the next epoch), a Keras
    ``PyDataset`` indexed, then ``on_epoch_end`` before the next epoch, as
    ``fit`` does. ``epochs`` counts the epochs started."""

    def __init__(self, reader: Any, keras: bool) -> None:
        self.reader, self.keras, self.epochs = reader, keras, 0

    def _one_epoch(self) -> Iterator[Any]:
        if not self.keras:
            yield from self.reader
            return
        for i in range(len(self.reader)):
            yield self.reader[i]
        self.reader.on_epoch_end()

    def __iter__(self) -> Iterator[Any]:
        while True:
            self.epochs += 1
            empty = True
            for batch in self._one_epoch():
                empty = False
                yield batch
            if empty:
                return


def _skip(items: Any, count: int) -> Any:
    it = iter(items)
    for _ in range(count):
        next(it, None)
    return it


def _tf_stages(store: Store, split: str, batch_size: int, seed: int,
               batches: int | None) -> list[Stage]:
    import tensorflow as tf

    from windowkit.readers import DEFAULT_CACHE_BYTES
    from windowkit.readers.tf import batch_cutter
    from windowkit.readers.tfdata.groups import block_groups

    plan = store.read_plan(split)  # the read + decode stage, alone
    fields = plan.store.fields(False)  # the reader's batches: dict fields where the store has them
    blocks = block_groups(plan, shuffle=True, seed=seed, shuffle_blocks=None,
                          cache_bytes=DEFAULT_CACHE_BYTES, with_series=fields.series)
    first: list[Any] = []

    def group_size(element: Any) -> tuple[int, int]:
        if not first:
            first.append(element)
        return int(tf.size(element[1])), _nbytes(element[0])

    read = _time_elements(blocks, None, group_size)
    read.name = "read+decode"
    gather = Stage("gather", 0.0, 0, 0)
    if first and int(tf.size(first[0][1])):
        limit = batches or GATHER_BATCHES
        repeat = 2 + (limit + 1) * batch_size // int(tf.size(first[0][1]))
        cut = tf.data.Dataset.from_tensors(tuple(first[0])).repeat(repeat).flat_map(
            batch_cutter(store.spec, batch_size, None, plan.store.target_positions, fields))
        gather = _time_elements(_skip(cut, 1), limit, _batch_size_of)
        gather.name = "gather"
    return [read, gather]


def _keras_stages(store: Store, split: str, batch_size: int, seed: int,
                  batches: int | None) -> list[Stage]:
    plan = store.read_plan(split)  # the read + decode stage: the blocks the reader loads
    reader, layout, halo = plan.store.row_reader(), plan.layout, plan.spec.span - 1
    useful = np.flatnonzero(plan.windows_per_block())
    rng = np.random.default_rng(seed)
    loads = (reader.read_rows(start, min(layout.total_rows, stop + halo))
             for start, stop in (layout.block_range(int(b)) for b in rng.permutation(useful)))
    read = _time_elements(loads, None, lambda rows: (0, int(rows.nbytes)))
    read.name = "read+decode"
    read.windows = plan.num_windows
    ds = store.keras_dataset(split, batch_size, shuffle=True, seed=seed)
    limit = min(len(ds), batches or GATHER_BATCHES)
    for i in range(limit):  # load the blocks these batches need
        ds[i]
    timed = _time_elements((ds[i] for i in range(limit)), None, _batch_size_of)
    timed.name = "gather"
    return [read, timed]


class _RowNumbers(RowReader):
    """A row reader whose rows hold their own global row numbers (float64)."""

    def __init__(self, block_rows: int) -> None:
        self.block_rows = block_rows

    def read_rows(self, start: int, stop: int) -> np.ndarray:
        return np.arange(start, stop, dtype=np.float64)[:, None]


@dataclass(frozen=True)
class _NumberedStore(StoreAccess):
    """A store whose rows are their row numbers: the readers' order, no data."""

    def row_reader(self) -> _RowNumbers:
        return _RowNumbers(self.layout.block_rows)


def batch_mixing(store: Store, *, split: str, batch_size: int, reader: str, shuffle: str,
                 seed: int) -> Mixing:
    """How many series and storage blocks one epoch's batches of ``reader``
    (with ``shuffle``, one of :data:`SHUFFLES`) hold, next to a uniform
    permutation of the same windows."""
    from windowkit.readers.epoch.choice import choose_shuffle

    plan = store.read_plan(split)
    layout = replace(plan.layout, dtype=np.dtype(np.float64), step_shape=(1,))
    numbered = replace(plan, store=_NumberedStore(**{
        **plan.store.__dict__, "layout": layout, "statistics": None, "target_positions": None,
        "known_positions": None, "static_values": None, "static_statistics": None}))
    # the stand-in's rows are 8 bytes: scale the byte budgets so that the groups
    # of blocks, which they size, are those of the real store
    scale = layout.row_bytes / plan.layout.row_bytes
    real = choose_shuffle(plan, SHUFFLES[shuffle_word(shuffle)])  # what the real reader does
    # the same mode on the stand-in: uniform ones as "global" (uniform at any
    # budget), block groups as "blocks" (their size from the scaled budget)
    same: dict[str, bool | str] = {"uniform": "global", "blocks": "blocks",
                                   "ordered": False}
    order = ShuffleOptions(same[real.mode], seed=seed,
                           memory_budget=max(1, int(real.memory_budget * scale)),
                           cache_bytes=max(1, int(real.cache_bytes * scale)))
    batch = BatchOptions(batch_size, drop_remainder=True)
    if reader == "tf":
        from windowkit.readers.tf import split_dataset

        batches: Any = iter(split_dataset(numbered, batch, order))
    else:
        from windowkit.readers.keras_pydataset import WindowPyDataset

        keras_ds = WindowPyDataset(numbered, batch, order)
        batches = (keras_ds[i] for i in range(len(keras_ds)))
    firsts = [np.asarray(b[0] if isinstance(b, tuple) else b)[:, 0, 0] for b in batches]
    if not firsts:
        raise InvalidSpecError(f"split {split!r} has no full batch of {batch_size} windows")
    rows = np.concatenate(firsts).astype(np.int64)  # each window's first row
    offsets = store.series_table.column("row_offset").to_numpy().astype(np.int64)
    block_rows = store.manifest.block_rows

    def distinct(rows: np.ndarray) -> tuple[float, float]:
        series = np.searchsorted(offsets, rows, side="right").reshape(-1, batch_size)
        blocks = (rows // block_rows).reshape(-1, batch_size)
        count = lambda ids: float(np.mean((np.diff(np.sort(ids, axis=1), axis=1) != 0  # noqa: E731
                                           ).sum(axis=1) + 1))
        return count(series), count(blocks)

    got = distinct(rows)
    uniform = distinct(rows[np.random.default_rng(seed).permutation(len(rows))])
    return Mixing(got[0], got[1], uniform[0], uniform[1])


def _baseline(store: Store, split: str, batch_size: int, seed: int, warmup: int,
              batches: int, window_bytes: int) -> dict[str, Any]:
    """The plain approach on the same windows: all in memory, ``shuffle().batch()``,
    read (epoch after epoch) for as many batches as the reader was timed."""
    import tensorflow as tf

    total = store.num_windows(split)
    need = total * window_bytes
    available = _available_bytes()
    if 2 * need > available:  # the windows, and the dataset's own copy of them
        return {"skipped": f"materializing {total:,} windows needs {2 * need / 2**30:.1f} GiB, "
                           f"{available / 2**30:.1f} GiB available"}
    windows = store.windows(split, np.arange(total))
    ds = tf.data.Dataset.from_tensor_slices(windows).shuffle(
        PLAIN_SHUFFLE_BUFFER, seed=seed).batch(batch_size).repeat().prefetch(tf.data.AUTOTUNE)
    timed = _time_elements(_skip(ds, warmup), batches, _batch_size_of)
    return {"windows_s": timed.windows_s, "seconds": timed.seconds, "windows": timed.windows,
            "materialized_bytes": int(need), "peak_rss_mb": peak_rss_mb()}


def _check_arguments(store: Store, split: str, reader: str, shuffle: str,
                     batches: int | None, warmup: int) -> None:
    if reader not in READERS:
        raise InvalidSpecError(f"reader must be one of {', '.join(READERS)}, got {reader!r}")
    if batches is not None and batches < 1:
        raise InvalidSpecError(f"batches must be >= 1, got {batches}")
    if warmup < 0:
        raise InvalidSpecError(f"warmup must be >= 0, got {warmup}")
    if store.num_windows(split) == 0:  # raises first for a split the store lacks
        raise InvalidSpecError(
            f"split {split!r} of {store.path} has no windows (a window spans "
            f"{store.spec.span} rows): nothing to time; `windowkit inspect` lists the "
            f"splits' windows")


def _reader(store: Store, split: str, batch_size: int, reader: str, shuffle: str,
            seed: int) -> tuple[_Epochs, int]:
    """The reader's batches epoch after epoch, and how many batches an epoch has."""
    mode = SHUFFLES[shuffle]
    if reader == "tf":
        ds = store.tf_dataset(split, batch_size, shuffle=mode, seed=seed)
        count = int(ds.cardinality())
        if count < 0:  # not declared by the reader: every window once, the last batch short
            count = -(-store.num_windows(split) // batch_size)
        return _Epochs(ds, keras=False), count
    keras_ds = store.keras_dataset(split, batch_size, shuffle=mode, seed=seed)
    return _Epochs(keras_ds, keras=True), len(keras_ds)


def run_bench(store: Store, *, split: str = "train", batch_size: int = 256,
              reader: str = "tf", shuffle: str = "true", batches: int | None = None,
              warmup: int = 5, baseline: bool = False, seed: int = 0) -> BenchReport:
    """Time ``reader`` over ``batches`` batches (default: the rest of one epoch;
    more than an epoch holds runs more epochs) after ``warmup`` batches (at most
    a quarter of an epoch), then its stages alone, how well it mixes batches,
    then (``baseline``) the plain materialized pipeline."""
    shuffle = shuffle_word(shuffle)
    _check_arguments(store, split, reader, shuffle, batches, warmup)
    epochs, count = _reader(store, split, batch_size, reader, shuffle, seed)
    warm = min(warmup, count // 4)
    run = _time_elements(_skip(epochs, warm), batches or count - warm, _batch_size_of)
    run.name = f"{reader} reader"
    rss = peak_rss_mb()
    make_stages = _tf_stages if reader == "tf" else _keras_stages
    stages = make_stages(store, split, batch_size, seed, batches)
    report = BenchReport(
        store=str(store.path), format=store.manifest.format, reader=reader, shuffle=shuffle,
        split=split, batch_size=batch_size, window_bytes=run.bytes // max(1, run.windows),
        run=run, peak_rss_mb=rss, stages=stages, batches_per_epoch=count, warmup=warm,
        warmup_asked=warmup, epochs=epochs.epochs)
    report.mode, report.memory_budget = shuffle_mode(store, split, shuffle)
    if store.num_windows(split) >= batch_size:
        report.mixing = batch_mixing(store, split=split, batch_size=batch_size, reader=reader,
                                     shuffle=shuffle, seed=seed)
    else:
        report.notes.append(f"mixing not measured: the split has no full batch of "
                            f"{batch_size} windows")
    if baseline:
        report.baseline = _baseline(store, split, batch_size, seed, warm, len(run.spans),
                                    report.window_bytes)
    return report


# -- reporting ---------------------------------------------------------------------------
def _plural(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 'es' if noun.endswith('ch') else 's'}"


def _run_lines(report: BenchReport) -> list[str]:
    """What was timed: warm-up, batches, epochs."""
    timed, per_epoch = len(report.run.spans), report.batches_per_epoch
    lines = []
    if report.warmup < report.warmup_asked:
        lines.append(
            f"  warm-up {_plural(report.warmup, 'batch')}, not {report.warmup_asked}: at most "
            f"a quarter of an epoch, and the split has {_plural(per_epoch, 'batch')} of "
            f"{report.batch_size}")
    if report.epochs > 1:
        lines.append(f"  timed {_plural(timed, 'batch')} after {report.warmup} warm-up: "
                     f"{report.epochs} epochs of {_plural(per_epoch, 'batch')} read")
    else:
        lines.append(f"  timed {_plural(timed, 'batch')} after {report.warmup} warm-up, "
                     f"in one epoch of {_plural(per_epoch, 'batch')}")
    return lines


def _stage_lines(report: BenchReport) -> list[str]:
    lines = ["  where the time goes (each stage alone):"]
    for stage in report.stages:
        if stage.name == "read+decode":
            lines.append(
                f"    read+decode  {stage.bytes / 1e6:,.1f} MB of blocks in {stage.seconds:.2f} s"
                f" ({stage.mb_s:,.0f} MB/s; {stage.windows_s:,.0f} windows/s of the split)")
        elif stage.windows:
            lines.append(
                f"    gather       {stage.windows:,} windows from blocks in memory in "
                f"{stage.seconds:.3f} s ({stage.windows_s:,.0f} windows/s)")
    return lines


def shuffle_mode(store: Store, split: str, shuffle: str) -> tuple[str, int]:
    """What ``shuffle`` does on ``split`` at the default memory budget, and that budget."""
    from windowkit.readers.epoch.choice import choose_shuffle

    plan = store.read_plan(split)
    choice = choose_shuffle(plan, SHUFFLES[shuffle_word(shuffle)])
    if choice.uniform:
        where = "in memory" if plan.rows_bytes() <= choice.memory_budget else "spilled to disk"
        mode = f"uniform, rows {where}"
    else:
        mode = {"blocks": "block groups", "ordered": "index order"}[choice.mode]
    return mode, choice.memory_budget


def render(report: BenchReport) -> str:
    r = report.run
    waited = sum(t1 - t0 for t0, t1 in r.spans)
    latency = np.array([t1 - t0 for t0, t1 in r.spans]) * 1e3
    lines = [
        f"{report.store}: {report.format}, {report.reader} reader, shuffle {report.shuffle}, "
        f"split {report.split!r}, batch {report.batch_size}",
        f"  shuffle: {report.mode}; memory budget {report.memory_budget / 2**20:,.0f} MiB "
        "(default: a quarter of the available memory)",
        *_run_lines(report),
        f"  {r.windows:,} windows in {len(r.spans)} batches, {r.seconds:.2f} s: "
        f"{r.windows_s:,.0f} windows/s, {r.mb_s:,.0f} MB/s, peak RSS {report.peak_rss_mb:,.0f} MB",
        f"  batch latency p50 {np.percentile(latency, 50):.2f} ms, p99 "
        f"{np.percentile(latency, 99):.2f} ms; the consumer waited {waited:.2f} s "
        f"({waited / r.seconds if r.seconds > 0 else 0:.0%}) for batches",
        *_stage_lines(report),
    ]
    mix = report.mixing
    if mix is not None:
        lines.append(
            f"  mixing: a batch holds {mix.series:.1f} distinct series and {mix.blocks:.1f} "
            f"storage blocks; a uniform permutation: {mix.uniform_series:.1f} and "
            f"{mix.uniform_blocks:.1f}")
    lines.extend(f"  {note}" for note in report.notes)
    base = report.baseline
    if base is not None and "skipped" in base:
        lines.append(f"  baseline skipped: {base['skipped']}")
    elif base is not None:
        lines.append(
            f"  baseline (materialized windows, shuffle({PLAIN_SHUFFLE_BUFFER}).batch("
            f"{report.batch_size})): {base['windows_s']:,.0f} windows/s, holding "
            f"{base['materialized_bytes'] / 2**20:,.0f} MiB of windows; windowkit is "
            f"{report.ratio:.2f}x")
    return "\n".join(lines)


@dataclass
class PlotData:
    """What :func:`plot` draws: each timeline row's spans, and the throughput
    curve (seconds, windows/s): per batch on a short run, else binned."""

    timeline: list[tuple[str, list[tuple[float, float]]]]
    throughput: tuple[np.ndarray, np.ndarray]
    per_batch: bool


PER_BATCH_POINTS = 40  # runs shorter than this plot each batch's rate


def plot_data(report: BenchReport) -> PlotData:
    """The series :func:`plot` draws, none of them empty for a run of >= 1 batch."""
    rows = [(f"{s.name} (alone)", s.spans) for s in report.stages if s.spans]
    rows.append(("consume: waiting for a batch", report.run.spans))
    ends = np.array([t1 for _, t1 in report.run.spans])
    per_batch = report.run.windows / max(1, len(ends))
    if len(ends) < PER_BATCH_POINTS:  # each batch: its windows over the time since the last
        gaps = np.diff(ends, prepend=0.0)
        return PlotData(rows, (ends, per_batch / np.maximum(gaps, 1e-6)), per_batch=True)
    counts, edges = np.histogram(ends, bins=min(50, len(ends) // 4))
    rate = counts * per_batch / np.maximum(np.diff(edges), 1e-9)
    return PlotData(rows, (edges, np.append(rate, rate[-1])), per_batch=False)


def plot(report: BenchReport, path: str | Path) -> PlotData:
    """A timeline of the stages and the reader's throughput over time, as a PNG;
    returns what was drawn."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise WindowkitError("--plot needs matplotlib: pip install 'windowkit[plot]'") from None
    data = plot_data(report)
    fig, (timeline, rate) = plt.subplots(2, 1, figsize=(10, 6.5), constrained_layout=True)
    colors = ["tab:blue", "tab:orange", "tab:green"]
    for y, (_, spans) in enumerate(data.timeline):
        bars = [(t0, max(t1 - t0, 1e-5)) for t0, t1 in spans]
        timeline.broken_barh(bars, (y - 0.35, 0.7), color=colors[y % len(colors)])
    timeline.set_yticks(range(len(data.timeline)), [label for label, _ in data.timeline])
    timeline.set_xlabel("seconds since the stage started")
    timeline.set_title(f"{report.format} {report.reader} reader: stage timeline")
    label = f"{report.format} {report.reader} reader"
    if data.per_batch:
        rate.plot(*data.throughput, marker="o", label=f"{label}, each batch")
    else:
        rate.step(*data.throughput, where="post", label=label)
    if report.baseline and "windows_s" in report.baseline:
        rate.axhline(report.baseline["windows_s"], color="tab:red", linestyle="--",
                     label="materialized windows (baseline)")
    rate.set_xlabel("seconds")
    rate.set_ylabel("windows/s")
    rate.set_xlim(left=0)
    rate.set_ylim(bottom=0)
    rate.legend(loc="best")
    rate.set_title("throughput")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return data
