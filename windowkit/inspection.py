"""What ``windowkit inspect`` reports about a store."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from windowkit._progress import human_size
from windowkit.formats import get_format
from windowkit.store import open_store


def describe(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A plain-dict summary of the store at ``path``."""
    store = open_store(path)
    m = store.manifest
    storage = get_format(m.format)
    data_bytes = sum(f.bytes for f in m.files if f.path.startswith("data/"))
    total_bytes = sum(f.bytes for f in m.files)
    row_bytes = store.dtype.itemsize
    for dim in m.step_shape:
        row_bytes *= dim
    order = [n for n in m.options.get("split") or [] if n in m.splits] or sorted(m.splits)
    unit = m.series.get("time_unit", "")
    return {
        "path": str(store.path),
        "format": m.format,
        "store_id": m.store_id,
        "dtype": m.dtype,
        "step_shape": list(m.step_shape),
        "columns": m.columns,
        "target_columns": m.target_columns,
        "window": m.window.to_dict(),
        "series": m.series["count"],
        "too_short_series": m.series["too_short"],
        "gap_skipped_windows": m.series.get("gap_skipped_windows", 0),
        "nan_skipped_windows": m.series.get("nan_skipped_windows", 0),
        "missing_rows": m.series.get("missing_rows", 0),
        "time_column": m.series.get("time_column"),
        "rows": m.total_rows,
        "splits": {name: m.splits[name]["windows"] for name in order},
        "split_times": {name: [_time(m.splits[name].get(k), unit)
                               for k in ("first_time", "last_time")]
                        for name in order if m.splits[name].get("first_time") is not None},
        "block_rows": m.block_rows,
        "block_bytes": m.block_rows * row_bytes,
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
    return str(np.datetime64(int(value), "ns").astype("datetime64[s]")) + "Z"


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
        ("window", ", ".join(f"{k}={v}" for k, v in window.items())),
        ("series", f"{summary['series']} ({summary['too_short_series']} too short for a window)"),
        ("rows", f"{summary['rows']:,}"),
        *([("time column", str(summary["time_column"]))] if summary["time_column"] else []),
        *[(f"windows [{name}]", f"{count:,}" + (
            f"  (times {summary['split_times'][name][0]}..{summary['split_times'][name][1]})"
            if name in summary["split_times"] else ""))
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
