"""Write the figures ``make bench`` measured into ``docs/performance.md``.

Each benchmark part leaves ``<part>.json`` in ``WINDOWKIT_BENCH_DIR``
(``bench-out/`` by default). The page holds one generated region per part,
between ``<!-- figures:PART -->`` and ``<!-- /figures:PART -->``; this script
rewrites the regions whose part has figures and leaves the rest of the page
(the prose around them, and parts not measured in this run) as it is.

A few parts belong on another page of ``docs/`` (``PART_PAGES``, e.g. the
convergence curves of ``make bench-convergence`` on ``docs/shuffling.md``);
``--docs`` names the directory those pages are in.

    python -m tests.benchmarks.perf_page [--bench-dir DIR] [--page PAGE.md] [--docs DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGE = DOCS / "performance.md"
FORMAT_NAMES = {"tfrecord": "TFRecord", "zarr": "Zarr", "parquet": "Parquet"}
MODES = {"default": "default (`shuffle=True`)", "global": "global", "blocks": "block groups"}
CONVERGENCE_MODES = {  # the input pipelines of tests/benchmarks/convergence.py: tag, what
    "materialized": ("(a)", "every window materialized in memory, permuted uniformly each epoch"),
    "reordered": ("(a')", "as (a), another permutation seed: the noise between two uniform "
                  "orders"),
    "default": ("(b)", "`shuffle=True` (the default)"),
    "global": ("(c)", "`shuffle=\"global\"`, `memory_budget` a quarter of the split's rows"),
    "none": ("(d)", "`shuffle=False`"),
}
X, DASH = "\u00d7", "\u2013"  # the page's multiplication sign and en dash


def _n(value: float) -> str:
    return f"{value:,.0f}"


def _per_cpu(figures: dict[str, Any]) -> str:
    """Windows per CPU-second of the process, where measured."""
    return _n(figures["cpu_windows_s"]) if "cpu_windows_s" in figures else ""


def _fmt(name: str) -> str:
    return FORMAT_NAMES.get(name, name)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table; every column but the first right-aligned."""
    lines = ["| " + " | ".join(header) + " |",
             "|---|" + "---:|" * (len(header) - 1)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _when(figures: dict[str, Any], command: str) -> str:
    return (f"*Measured by `{command}` on {figures.get('date', 'an unrecorded date')}, "
            f"on a {figures.get('cores', '?')}-core machine.*")


def throughput(fig: dict[str, Any]) -> list[str]:
    """Each reader against every window materialized in memory."""
    best, conv, raw = fig["best"], fig["convert"], fig["raw_bytes"]
    plain = best["materialized"]
    rows = []
    for f in sorted(conv):
        tf, keras, two = (best.get(f"{f} {r}") for r in
                          ("tf_dataset", "keras_dataset", "keras_dataset x2"))
        if tf:
            rows.append([f"{_fmt(f)} `tf_dataset`", _n(tf["windows_s"]), _per_cpu(tf),
                         f"**{tf['windows_s'] / plain['windows_s']:.2f}{X}**",
                         f"{tf['peak_rss_mb']:,.0f} MB",
                         f"{fig['disk_bytes'][f] / raw:.2f}{X} raw",
                         f"{conv[f]['convert_mb_s']:,.0f} MB/s", ""])
        if keras:
            rows.append([f"{_fmt(f)} `keras_dataset`", _n(keras["windows_s"]), _per_cpu(keras),
                         f"{keras['windows_s'] / plain['windows_s']:.2f}{X}",
                         f"{keras['peak_rss_mb']:,.0f} MB", "", "",
                         _n(two["windows_s"]) if two else ""])
    rows.append(["plain: every window materialized in memory, `shuffle(10000).batch(256)`",
                 _n(plain["windows_s"]), _per_cpu(plain), f"1.00{X}",
                 f"{plain['peak_rss_mb']:,.0f} MB", "", "", ""])
    header = ["reader", "windows/s", "per CPU-second", "vs plain", "peak RSS", "data on disk",
              "convert", "2 threads"]
    return [_when(fig, "make bench"), "", *_table(header, rows), "",
            f"`import tensorflow` alone peaks at {fig['tf_import']['peak_rss_mb']:,.0f} MB; "
            f"the materialized windows need {plain['materialized_bytes'] / 2**20:.0f} MiB "
            f"for {raw / 2**20:.0f} MiB of rows. Best of {fig['rounds']} epochs per reader, "
            "each taken in a Python loop; *per CPU-second*: windows per second of the "
            "process's CPU time (every thread).",
            *[f"- {line}" for line in fig.get("cpu_bars", [])],
            *_check_cost(best)]


def _check_cost(best: dict[str, Any]) -> list[str]:
    """Each reader with its per-block checks on against off, when measured."""
    rows = []
    for key in sorted(k for k in best if f"{k} unchecked" in best):
        on, off = best[key], best[f"{key} unchecked"]
        fmt, reader = key.split(" ", 1)
        rows.append([f"{_fmt(fmt)} `{reader}`", _n(on["windows_s"]), _n(off["windows_s"]),
                     f"{on['windows_s'] / off['windows_s']:.3f}"])
    if not rows:
        return []
    return ["", "Every block read is checked against its digest; what the checks cost "
            "(same run, windows/s):", "",
            *_table(["reader", "checks on", "checks off", "on / off"], rows)]


def shuffling(fig: dict[str, Any]) -> list[str]:
    """Both shuffle modes against every window materialized and permuted once."""
    best, mixing = fig["best"], fig["mixing"]
    base = best["permuted"]
    rows = []
    for mode, label in MODES.items():
        for key in sorted(k for k in best if k.endswith(" " + mode)):
            r, mix = best[key], mixing.get(key, {})
            mixed = ([f"{mix['series']:.1f} of {mix['uniform_series']:.1f}",
                      f"{mix['blocks']:.1f} of {mix['uniform_blocks']:.1f}"] if mix else ["", ""])
            rows.append([f"{_fmt(key.split()[0])}, {label}", _n(r["windows_s"]), _per_cpu(r),
                         f"{r['windows_s'] / base['windows_s']:.2f}{X}",
                         f"{r['peak_rss_mb']:,.0f} MB", *mixed])
    rows.append(["materialized, permuted, `from_tensor_slices(...).batch(256)`",
                 _n(base["windows_s"]), _per_cpu(base), f"1.00{X}",
                 f"{base['peak_rss_mb']:,.0f} MB", "", ""])
    if "tf_import" in fig:
        rows.append(["TensorFlow imported, nothing read", "", "", "",
                     f"{fig['tf_import']['peak_rss_mb']:,.0f} MB", "", ""])
    header = ["`tf_dataset`", "windows/s", "per CPU-second", "vs materialized and permuted",
              "peak RSS",
              "distinct series per batch", "distinct blocks per batch"]
    return [_when(fig, "make bench"), "", *_table(header, rows), "",
            f"Best of {fig['rounds']} epochs each; \"of\" gives what a uniform permutation "
            "of the same windows gives."]


def sharding(fig: dict[str, Any]) -> list[str]:
    """One process reading the whole split against two shards at once."""
    rows = []
    for r in fig["rows"]:
        shards = [f"{_n(s['windows'])}, {s['read_bytes'] / 1e6:.1f}" for s in r["shards"]]
        rows.append([f"{_fmt(r['format'])}, {MODES.get(r['mode'], r['mode'])}",
                     _n(r["whole"]["windows_s"]), f"{r['whole']['read_bytes'] / 1e6:.1f}",
                     *shards, f"{r['together'] / r['whole']['windows_s']:.2f}{X} whole"])
    header = ["`tf_dataset`", "whole: windows/s", "MB read", "shard 0: windows, MB read",
              "shard 1: windows, MB read", "both shards together"]
    data = sorted({f"{r['data_mb']:.1f}" for r in fig["rows"]})
    return [_when(fig, "make bench"), "", *_table(header, rows), "",
            f"One epoch per process including its start-up, best of {fig['rounds']}; "
            f"data files: {', '.join(data)} MB."]


def forecasting(fig: dict[str, Any]) -> list[str]:
    """Dict batches against plain ``(x, y)`` batches, per reader and format."""
    found = {(r["format"], r["reader"]): r for r in fig["rows"]}
    formats = sorted({f for f, _ in found}, key=lambda f: list(FORMAT_NAMES).index(f)
                     if f in FORMAT_NAMES else len(FORMAT_NAMES))

    def cells(reader: str, cell: Callable[[dict[str, Any]], str]) -> list[str]:
        return [cell(found[f, reader]) if (f, reader) in found else "" for f in formats]

    rows = []
    for reader, name in (("tf", "`tf_dataset`"), ("keras", "`keras_dataset`")):
        rows += [[f"{name}, plain `(x, y)`",
                  *cells(reader, lambda r: f"{_n(r['plain'])} windows/s")],
                 [f"{name}, dict / plain", *cells(
                     reader,
                     lambda r: f"{r['ratio']:.2f}{X} ({r['low']:.2f}{DASH}{r['high']:.2f})")],
                 ["ditto, per CPU second", *cells(reader, lambda r: f"{r['cpu_ratio']:.2f}{X}")]]
    return [_when(fig, "make bench"), "", *_table(["reader", *map(_fmt, formats)], rows), "",
            f"Medians of {fig['rounds']} paired rounds (quartiles in brackets)."]


def memory(fig: dict[str, Any]) -> list[str]:
    """Convert speed and RSS, and the readers' peak RSS as the store grows."""
    rows: list[list[str]] = []
    rss: dict[str, list[tuple[float, float]]] = {}
    for r in fig["rows"]:
        conv, par, tf, keras = r["convert"], r["parallel"], r["tf"], r["keras"]
        rows.append([_fmt(r["format"]), f"{r['gib']:g} GiB", f"{conv['convert_mb_s']:,.0f} MB/s",
                     f"{par['convert_mb_s']:,.0f} MB/s",
                     f"{par['peak_rss_mb']:.0f} + {par['worker_peak_rss_mb']:,.0f} MB",
                     f"{_n(tf['windows_s'])} windows/s", f"{tf['peak_rss_mb']:,.0f} MB",
                     f"{_n(keras['windows_s'])} windows/s", f"{keras['peak_rss_mb']:,.0f} MB"])
        rss.setdefault(r["format"], []).append((tf["peak_rss_mb"], keras["peak_rss_mb"]))
    header = ["format", "size", "convert", "`--workers 2`", "convert peak RSS (main + worker)",
              "`tf_dataset` epoch", "its peak RSS", "`keras_dataset` epoch", "its peak RSS"]
    growth = "; ".join(f"{_fmt(f)} {v[-1][0] - v[0][0]:+.0f} / {v[-1][1] - v[0][1]:+.0f} MB"
                       for f, v in rss.items() if len(v) > 1)
    lines = [_when(fig, "make bench-memory"), "", *_table(header, rows), "",
             f"`import tensorflow` alone: {fig['tf_import']['peak_rss_mb']:,.0f} MB."]
    if growth:
        lines[-1] += (" Reader peak RSS, largest store minus smallest (`tf_dataset` / "
                      f"`keras_dataset`): {growth}.")
    return lines


def csv(fig: dict[str, Any]) -> list[str]:
    """A long CSV converted in bounded memory, and an interleaved one grouped in memory."""
    lines = [_when(fig, "make bench-csv"), ""]
    runs = fig["formats"]
    if runs:
        first = next(iter(runs.values()))
        each = "; ".join(f"{_fmt(f)}: {r['seconds']:.0f} s, {r['csv_mb_s']:,.0f} MB/s of CSV, "
                         f"peak RSS {r['peak_rss_mb']:,.0f} MB" for f, r in runs.items())
        lines.append(f"- A {first['csv_bytes'] / 2**30:.2f} GiB long CSV ({_n(first['rows'])} "
                     f"rows of {fig['series']} series, an integer time column, 8 float "
                     f"columns), streamed: {each}.")
    if inter := fig.get("interleaved"):
        lines.append(f"- A {inter['csv_bytes'] / 2**20:.0f} MiB CSV of {inter['series']} "
                     f"interleaved series ({_n(inter['rows'])} rows), grouped in memory and "
                     f"converted to {_fmt(inter['format'])}: {inter['seconds']:.0f} s, "
                     f"peak RSS {inter['peak_rss_mb']:,.0f} MB.")
    return lines


def convergence(fig: dict[str, Any]) -> list[str]:
    """Final validation losses per input pipeline and task, and the curves."""
    tasks = fig["tasks"]
    rows = []
    for mode, (tag, label) in CONVERGENCE_MODES.items():
        cells = [[f"{t['final'][mode]:.4f}", f"{t['ratio'][mode]:.3f}{X}" if t["ratio"] else ""]
                 if mode in t["final"] else ["", ""] for t in tasks.values()]
        rows.append([f"{tag} {label}", *(c for pair in cells for c in pair)])
    header = ["input pipeline", *(h for name in tasks
                                  for h in (f"{name}: final val MSE", "vs (a)"))]
    lines = [_when(fig, "make bench-convergence"), "", *_table(header, rows), ""]
    for name, t in tasks.items():
        what = (f"{t['window']} steps in, the next {t['horizon']} out" if t["horizon"]
                else f"windows of {t['window']} steps, the target the window reversed")
        spread = ", ".join(f"{CONVERGENCE_MODES[m][0]} {v:.1%}"
                           for m, v in t["spread"].items())
        lines.append(f"- `{name}`: {t['title']}: {t['source']}; {t['series']} series {X} "
                     f"{t['features']} feature{'s' if t['features'] > 1 else ''}, {what}; "
                     f"{_n(t['train_windows'])} training windows, "
                     f"{_n(t['val_windows'])} validation windows; {t['steps'][-1]} steps of "
                     f"batch {t['batch']}, Adam {t['learning_rate']:g} (cosine decay); "
                     f"{_fmt(t['format'])} store. Spread of the final loss over seeds "
                     f"(standard deviation / mean): {spread}.")
    lines += ["", f"Every run evaluates every {fig['eval_every']} steps; its final loss is the "
              f"mean of its last {fig['final_evaluations']} evaluations, averaged over "
              f"{fig['seeds']} seeds (a seed fixes the initial weights and the reader's "
              f"order). The whole run took {fig['seconds']:.0f} s.", ""]
    same = [name for name, t in tasks.items()
            if {"default", "global"} <= set(t["curves"])
            and t["curves"]["default"] == t["curves"]["global"]]
    if same:
        lines += [f"In {' and '.join(f'`{n}`' for n in same)}, (b) and (c) give the same "
                  "curves: the split fits the default budget, so `shuffle=True` is the same "
                  "uniform permutation (same seed) as (c), gathered from rows held in memory "
                  "where (c) reads each batch's windows by random access from local disk.",
                  ""]
    for name, t in tasks.items():
        lines += [f"![validation loss, {name}]({t['image']})", ""]
    return lines[:-1]


def beyond(fig: dict[str, Any]) -> list[str]:
    """Uniform shuffling in memory, spilled (warm and cold) and block groups, one
    epoch each, on a store larger than the spilled readers' budget."""
    rows = []
    for fmt, results in fig["formats"].items():
        base = results["in memory"]["windows_s"]
        for mode, r in results.items():
            rows.append([f"{_fmt(fmt)}, {mode}", _n(r["windows_s"]),
                         f"{r['windows_s'] / base:.2f}{X}", f"{r['build_s']:.1f} s",
                         f"{r['peak_over_mb']:,.0f} MB",
                         f"{r['anon_over_mb']:,.0f} MB" if "anon_over_mb" in r else "",
                         "yes" if r["exactly_once"] else "**no**",
                         f"{r['series']:.1f} of {r['uniform_series']:.1f}",
                         f"{r['buckets']:.1f} of {r['uniform_buckets']:.1f}"])
    header = ["store, mode", "windows/s", "vs in memory", "build", "peak+", "anon+", "once",
              "distinct series per batch", "distinct (series, bucket) per batch"]
    return [_when(fig, "make bench"), "",
            f"{fig['series']} series {X} {fig['rows_per_series']:,} rows {X} "
            f"{fig['features']} float32 ({fig['mib']} MiB), `compression=\"none\"`; "
            f"L={fig['length']}, batch {fig['batch']}; spilled: `memory_budget` = "
            f"{fig['budget_mib']} MiB.", "", *_table(header, rows)]


def frameworks(fig: dict[str, Any]) -> list[str]:
    """The PyTorch and Grain readers against the plain ways, one epoch each."""
    rows = []
    for name, r in fig["best"].items():
        rows.append([name, _n(r["windows_s"]), f"{r['windows_s'] / fig['plain']:.2f}{X}",
                     f"{r['windows_s'] / fig['tensor_dataset']:.2f}{X}",
                     f"{r['windows_s'] / fig['ceiling']:.2f}{X}", f"{r['peak_pss_mb']:,.0f} MB"])
    header = ["reader", "windows/s", "vs plain per-window", "vs TensorDataset",
              "vs one-gather ceiling", "peak PSS"]
    return [_when(fig, "make bench"), "",
            f"`make bench`'s data, shuffled epochs, L={fig.get('length', 32)}, batch "
            f"{fig.get('batch', 256)}, best of {fig['rounds']} rounds. *Plain per-window*: "
            "the faster of the per-window `DataLoader`s (0 or 2 workers); *TensorDataset*: "
            "every window materialized, `DataLoader(TensorDataset, batch_size=B, "
            "shuffle=True)`; *one-gather ceiling*: every window materialized, a batch one "
            "NumPy gather; *hand-over alone*: what 2 `DataLoader` workers deliver when "
            "making a batch costs nothing.", "", *_table(header, rows)]


def training(fig: dict[str, Any]) -> list[str]:
    """Each reader consumed as training consumes it, beside materialized windows."""
    rates = {(r["consumer"], r["reader"]): r["windows_s"] for r in fig["lines"]}
    rows = []
    for r in fig["lines"]:
        base = rates.get((r["consumer"], "materialized"))
        ratio = f"{r['windows_s'] / base:.2f}{X}" if base else ""
        own = r["reader"] in ("materialized", "np.take") or r["reader"].startswith("memmap")
        reader = r["reader"] if own else f"{_fmt(r['format'])} {r['reader']}"
        rows.append([r["consumer"], reader, _n(r["windows_s"]), ratio,
                     f"{r['cpu_s_per_m']:.2f}", f"{r['peak_over_mb']:,.0f} MB",
                     f"{r['anon_over_mb']:,.0f} MB", f"{r['rows_mb']:,.0f} MB"])
    header = ["consumer", "reader", "windows/s", "vs materialized", "CPU s/M", "peak+",
              "anon+", "rows"]
    return [_when(fig, "make bench"), "",
            f"{fig['series']} series {X} {fig['rows_per_series']:,} rows {X} 16 float32 "
            f"({fig['mib']} MiB); L={fig['length']}, batch {fig['batch']}; spilled: "
            f"`memory_budget` = {fig['spill_budget_mib']} MiB. `grain_batches:0` and "
            "`memmap:0`: `ReadOptions(num_threads=0)`; `:1`: one thread, 4 batches ahead."
            + _training_rounds(fig.get("rounds")),
            "", *_table(header, rows), "", *[f"- {line}" for line in fig["bars"]]]


def _training_rounds(rounds: dict[str, int] | None) -> str:
    """How many runs each line is the best of, when recorded."""
    if not rounds:
        return ""
    fit, other = rounds.get("fit", 1), rounds.get("loop", 1)
    return (f" Each line is the best of {other} run{'s' if other > 1 else ''} "
            f"(the `fit` lines of {fit}), the rounds interleaved.")


def gpu(fig: dict[str, Any]) -> list[str]:
    """``make bench-gpu``: steps/s and the share of step time waiting for input."""
    rows = []
    for r in fig["rows"]:
        if "error" in r:
            rows.append([r["framework"], r["reader"], f"failed: {r['error']}", "", "", ""])
            continue
        wait = f"{100 * r['wait_share']:.1f}%" if "wait_share" in r else "n/a"
        ceiling = r.get("vs_ceiling")
        rows.append([r["framework"], r["reader"], f"{r['steps_s']:,.1f}", _n(r["windows_s"]),
                     wait, f"{ceiling:.2f}{X}" if ceiling else "n/a"])
    header = ["framework", "reader", "steps/s", "windows/s", "input wait", "vs ceiling"]
    return [f"*Measured by `make bench-gpu` on {fig.get('date', 'an unrecorded date')}, "
            f"{fig['gpu']}, {fig.get('cores', '?')} cores: {fig['mib']} MiB store, batch "
            f"{fig['batch']}, {fig['warmup']} + {fig['steps']} steps a line.*", "",
            *_table(header, rows), "", *[f"- skipped: {why}" for why in fig.get("skipped", [])]]


def cores(fig: dict[str, Any]) -> list[str]:
    """Windows/s per pinned core count (``make bench-cores``), written by its module."""
    from tests.benchmarks.cores import page

    return page(fig)


PARTS: dict[str, Callable[[dict[str, Any]], list[str]]] = {
    "throughput": throughput, "shuffling": shuffling, "sharding": sharding,
    "forecasting": forecasting, "memory": memory, "csv": csv, "convergence": convergence,
    "beyond": beyond, "frameworks": frameworks, "cores": cores, "training": training,
    "gpu": gpu,
}
# parts whose region is on another page
PART_PAGES = {"convergence": "shuffling.md", "beyond": "shuffling.md",
              "frameworks": "frameworks.md", "cores": "cores.md"}


def render(page: str, bench_dir: Path, parts: list[str] | None = None
           ) -> tuple[str, list[str]]:
    """The page with each measured part's region rewritten, and the parts
    rewritten; ``parts``: those of the page (default: those of ``--page``)."""
    done = []
    for part, write in PARTS.items():
        if part not in (parts if parts is not None else set(PARTS) - set(PART_PAGES)):
            continue
        source = bench_dir / f"{part}.json"
        if not source.is_file():
            continue
        start, end = f"<!-- figures:{part} -->", f"<!-- /figures:{part} -->"
        pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
        if pattern.search(page) is None:
            raise SystemExit(f"perf_page: the page has no {start} ... {end} region")
        body = "\n".join(write(json.loads(source.read_text())))
        found = pattern.search(page)
        assert found is not None
        page = f"{page[:found.start()]}{start}\n{body}\n{end}{page[found.end():]}"
        done.append(part)
    return page, done


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.perf_page")
    parser.add_argument("--bench-dir", type=Path,
                        default=Path(os.environ.get("WINDOWKIT_BENCH_DIR", "bench-out")))
    parser.add_argument("--page", type=Path, default=PAGE)
    parser.add_argument("--docs", type=Path, default=DOCS,
                        help="the directory of the pages in PART_PAGES")
    args = parser.parse_args(argv)
    pages = {args.page: None, **{args.docs / name: [p for p, n in PART_PAGES.items() if n == name]
                                 for name in set(PART_PAGES.values())}}
    for path, parts in pages.items():
        if parts is not None and not any((args.bench_dir / f"{p}.json").is_file()
                                         for p in parts):
            continue  # nothing measured for that page: leave it unread
        page, done = render(path.read_text(), args.bench_dir, parts)
        if done:
            tmp = path.with_suffix(".md.tmp")
            tmp.write_text(page)
            tmp.replace(path)
        print(f"{path}: figures of {', '.join(done) or 'no part'} from {args.bench_dir}")


if __name__ == "__main__":
    main()
