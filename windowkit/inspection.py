"""What ``windowkit inspect`` reports about a store."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from windowkit._progress import human_size
from windowkit.errors import WindowkitError
from windowkit.formats import get_format
from windowkit.store import open_store


def describe(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A plain-dict summary of the store at ``path``."""
    store = open_store(path)
    m = store.manifest
    storage = get_format(m.format)
    data_bytes = sum(f.bytes for f in m.files if f.path.startswith("data/"))
    total_bytes = sum(f.bytes for f in m.files)
    order = [n for n in m.options.get("split") or [] if n in m.splits] or sorted(m.splits)
    unit = m.series.time_unit
    return {
        "path": str(store.path),
        "format": m.format,
        "store_id": m.store_id,
        "dtype": m.dtype,
        "step_shape": list(m.step_shape),
        "columns": m.columns,
        "target_columns": m.target_columns,
        "known_columns": m.known_columns,
        "static_columns": m.static_columns,
        "window": m.spec.to_dict(),
        "series": m.series.count,
        "too_short_series": m.series.too_short,
        "gap_skipped_windows": m.series.gap_skipped_windows,
        "nan_skipped_windows": m.series.nan_skipped_windows,
        "missing_rows": m.series.missing_rows,
        "time_column": m.series.time_column,
        "rows": m.total_rows,
        "splits": {name: m.splits[name].windows for name in order},
        "split_context": m.options.get("split_context", "none"),
        # the times of the split's earliest window's first row (first target under the
        # history context) and its latest window's last row, recorded at conversion
        # from the index entries and the series' times
        "split_times": {name: [_time(m.splits[name].first_time, unit),
                               _time(m.splits[name].last_time, unit)]
                        for name in order if m.splits[name].first_time is not None},
        # what those times are: the rows the windows read, or (history context,
        # every split after the first) from the first target on
        "split_times_are": {name: "targets" if k and m.options.get("split_context") == "history"
                            else "rows" for k, name in enumerate(order)
                            if m.splits[name].first_time is not None},
        "block_rows": m.block_rows,
        "block_bytes": m.block_rows * store.layout.row_bytes,
        "compression": m.data.get("compression"),
        "raw_bytes": m.data.get("raw_bytes"),
        "data_bytes_on_disk": data_bytes,
        "store_bytes_on_disk": total_bytes,
        "files": len(m.files),
        "data_files": storage.data_files(m.data),
        "block_name": storage.block_name,
    }


def _time(value: int | None, unit: str) -> int | str | None:
    """A stored time as users wrote it: ISO dates and UTC date-times, or the number."""
    if value is None or unit not in ("ns", "days"):
        return value
    if unit == "days":
        return str(np.datetime64(int(value), "D"))
    # at the resolution the time has: whole seconds, else ms, us or ns (never rounded)
    step = next(u for u, ns in (("s", 10**9), ("ms", 10**6), ("us", 10**3), ("ns", 1))
                if int(value) % ns == 0)
    return str(np.datetime64(int(value), "ns").astype(f"datetime64[{step}]")) + "Z"


def _times_label(summary: dict[str, Any], split: str) -> str:
    """How a split's times are shown: ``times`` (of the rows its windows read),
    or ``target times`` (from its first target on, under the history context)."""
    return "target times" if summary.get("split_times_are", {}).get(split) == "targets" \
        else "times"


def _names(names: list[str], shown: int = 8) -> str:
    if len(names) <= shown:
        return ", ".join(names)
    return ", ".join(names[:shown]) + f", ... ({len(names)} in all)"


def render(summary: dict[str, Any]) -> str:
    """The summary as aligned text lines."""
    window = summary["window"]
    raw, on_disk = summary["raw_bytes"], summary["data_bytes_on_disk"]
    ratio = f" ({on_disk / raw:.2f}x raw)" if raw else ""
    lines = [
        ("store", summary["path"]),
        ("format", summary["format"]),
        ("store id", summary["store_id"]),
        ("dtype", summary["dtype"]),
        ("step shape", str(tuple(summary["step_shape"]))),
        *([("columns", _names(summary["columns"]))] if summary["columns"] else []),
        *([("target columns", ", ".join(summary["target_columns"]))]
          if summary["target_columns"] else []),
        *([("known columns", ", ".join(summary["known_columns"]) + " (known over the horizon)")]
          if summary["known_columns"] else []),
        *([("static columns", ", ".join(summary["static_columns"]) + " (one value per series)")]
          if summary["static_columns"] else []),
        ("window", ", ".join(f"{k}={v}" for k, v in window.items())),
        ("series", f"{summary['series']} ({summary['too_short_series']} too short for a window)"),
        ("rows", f"{summary['rows']:,}"),
        *([("time column", str(summary["time_column"]))] if summary["time_column"] else []),
        *([("split context", "history (val/test inputs may come from earlier rows; their "
                             "times are the targets')")]
          if summary["split_context"] == "history" else []),
        *[(f"windows [{name}]", f"{count:,}" + (
            f"  ({_times_label(summary, name)} {summary['split_times'][name][0]}.."
            f"{summary['split_times'][name][1]})"
            if name in summary["split_times"] else "" if count else "  (none: nothing to read)"))
          for name, count in summary["splits"].items()],
        *([("windows skipped", f"{summary['gap_skipped_windows']:,} (they span a time gap)")]
          if summary["gap_skipped_windows"] else []),
        *([("windows skipped", f"{summary['nan_skipped_windows']:,} (they touch one of "
                               f"{summary['missing_rows']:,} rows with NaN or inf)")]
          if summary["missing_rows"] else []),
        ("blocks", f"{summary['block_rows']:,} rows ({human_size(summary['block_bytes'])}) per "
                   f"{summary['block_name']}"),
        *([("data files", f"{summary['data_files']:,}")] if summary["data_files"] else []),
        ("compression", str(summary["compression"])),
        ("data on disk", f"{human_size(on_disk)} vs {human_size(raw)} raw{ratio}"),
        ("store on disk",
         f"{human_size(summary['store_bytes_on_disk'])} in {summary['files']} files"),
    ]
    width = max(len(k) for k, _ in lines)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in lines)


SAMPLED_SERIES = 24  # series drawn on the coverage timeline


def plot(path: str | os.PathLike[str], png: str | os.PathLike[str]) -> None:
    """A picture of the store at ``path``, as a PNG: series lengths; each split's
    coverage of a sample of series (rows a window of the split reads); windows
    per split and those skipped at time gaps and missing values."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise WindowkitError("--plot needs matplotlib: pip install 'windowkit[plot]'") from None
    store = open_store(path)
    summary = describe(path)
    rows = store.series_table.column("rows").to_numpy().astype(np.int64)
    fig, (lengths, timeline, counts) = plt.subplots(
        3, 1, figsize=(10, 11), constrained_layout=True,
        gridspec_kw={"height_ratios": [1, 2.2, 1]})
    _plot_lengths(lengths, rows, store.spec.span)
    keys = [str(k) for k in store.series_table.column("key").to_pylist()]
    _plot_coverage(timeline, store, rows, list(summary["splits"]), keys)
    _plot_counts(counts, summary)
    fig.suptitle(f"{summary['path']}: {summary['format']}, {summary['series']:,} series, "
                 f"{summary['rows']:,} rows")
    fig.savefig(png, dpi=100)
    plt.close(fig)


def length_bins(rows: np.ndarray) -> np.ndarray:
    """The bin edges of the series-length histogram: geometric over a wide
    range; over a narrow one (one length, or lengths close together) linear and
    at least a tenth of the lengths wide, so that no bar is a sliver."""
    low, high = int(rows.min()), int(rows.max())
    if high > 20 * max(1, low):
        return np.unique(np.geomspace(max(1, low), high + 1, 40).astype(int))
    pad = max(1.0, 0.1 * high) if high - low < 0.1 * high or high == low else 0.0
    bins = min(40, max(1, high - low + 1))
    return np.linspace(max(0.0, low - pad), high + 1 + pad, bins + 1)


def _plot_lengths(ax: Any, rows: np.ndarray, span: int) -> None:
    ax.hist(rows, bins=length_bins(rows), color="tab:blue")
    if rows.max() > 20 * max(1, rows.min()):
        ax.set_xscale("log")
    ax.axvline(span, color="tab:red", linestyle="--", label=f"a window's span ({span} rows)")
    ax.set_xlabel("rows per series")
    ax.set_ylabel("series")
    ax.set_title(f"series lengths ({int((rows < span).sum()):,} too short for a window)")
    ax.legend(loc="upper right")


def _plot_coverage(ax: Any, store: Any, rows: np.ndarray, splits: list[str],
                   keys: list[str]) -> None:
    """One line per sampled series, labelled by its key: its rows, and under it
    the rows each split's windows read (blank stretches: gaps, missing values,
    or no window fits)."""
    sample = np.unique(np.linspace(0, len(rows) - 1, min(SAMPLED_SERIES, len(rows))).astype(int))
    colors = ["tab:green", "tab:orange", "tab:purple", "tab:brown", "tab:pink", "tab:olive"]
    height = 0.8 / (len(splits) + 1)
    span = store.spec.span
    for y, series in enumerate(sample):
        ax.broken_barh([(0, int(rows[series]))], (y, height * 0.9), color="lightgray")
    for k, name in enumerate(splits):
        runs = store.runs(name)
        for y, series in enumerate(sample):
            mine = runs.series == series
            lo = runs.first[mine]
            hi = lo + (runs.count[mine] - 1) * runs.stride + span
            ax.broken_barh([(int(a), int(b - a)) for a, b in zip(lo, hi, strict=True)],
                           (y + (k + 1) * height, height * 0.9), color=colors[k % len(colors)],
                           label=name if y == 0 else None)
    ax.set_yticks(np.arange(len(sample)) + 0.4, [keys[s] for s in sample], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("row within the series")
    ax.set_title(f"rows the windows of each split read ({len(sample)} of {len(rows):,} series; "
                 "gray: the series)")
    ax.legend(loc="lower right", fontsize=8)


def _plot_counts(ax: Any, summary: dict[str, Any]) -> None:
    labels = [f"windows [{name}]" for name in summary["splits"]]
    values = list(summary["splits"].values())
    labels += ["skipped: time gap", "skipped: missing value"]
    values += [summary["gap_skipped_windows"], summary["nan_skipped_windows"]]
    bars = ax.barh(labels, values, color=["tab:green"] * len(summary["splits"])
                   + ["tab:red", "tab:red"])
    ax.bar_label(bars, labels=[f"{v:,}" for v in values], fontsize=8, padding=2)
    ax.invert_yaxis()
    ax.set_xlabel("windows")
    ax.set_title("windows per split, and windows left out")
