"""The conventions a Python (and Zarr) user expects of a package: ``python -m
windowkit``, a ``py.typed`` marker, a quiet library logger, and a Zarr array
whose axes are named so that xarray and xbatcher can open it, and Parquet
value columns named as in the source."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.core.metadata import ArrayV3Metadata

import windowkit as wk
from windowkit.formats.zarr_rows import dimension_names
from windowkit.verify import verify_store

ROOT = Path(__file__).resolve().parent.parent


def test_python_dash_m_runs_the_command_line() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, "-m", "windowkit", "--help"], capture_output=True,
                          text=True, timeout=120, cwd=ROOT, env=env, check=False)
    assert done.returncode == 0, done.stderr
    assert "Usage: windowkit" in done.stdout
    for command in ("convert", "inspect", "verify", "bench"):
        assert command in done.stdout


def test_the_package_logger_has_a_null_handler() -> None:
    handlers = logging.getLogger("windowkit").handlers
    assert any(isinstance(h, logging.NullHandler) for h in handlers), handlers


def test_the_package_is_marked_typed() -> None:
    assert (Path(wk.__file__).parent / "py.typed").is_file()


@pytest.mark.parametrize("step, names", [
    ((), ("row",)),
    ((3,), ("row", "feature")),
    ((2, 3, 2), ("row", "step_dim_0", "step_dim_1", "step_dim_2")),
])
def test_the_zarr_array_names_its_dimensions(tmp_path: Path, step: tuple[int, ...],
                                             names: tuple[str, ...]) -> None:
    values = np.arange(40 * int(np.prod(step, dtype=np.int64)), dtype=np.float32).reshape(
        40, *step)
    store = wk.convert(values, tmp_path / "store", format="zarr", window=8, horizon=2)
    assert dimension_names(step) == names
    metadata = zarr.open_array(store=str(store.path / "data"), mode="r").metadata
    assert isinstance(metadata, ArrayV3Metadata)
    assert metadata.dimension_names == names
    np.testing.assert_array_equal(zarr.open_array(store=str(store.path / "data"), mode="r")[:],
                                  values)
    # the store still reads and verifies (windowkit's metadata checks accept the names)
    x, _ = store.windows("train", np.arange(store.num_windows("train")))
    np.testing.assert_array_equal(x[0], values[:8])
    assert verify_store(store.path) == []


def test_a_store_without_dimension_names_still_reads(tmp_path: Path) -> None:
    """An earlier release wrote no ``dimension_names``: such a store opens and reads."""
    values = np.arange(60, dtype=np.float32).reshape(30, 2)
    store = wk.convert(values, tmp_path / "store", format="zarr", window=4)
    x_new = store.windows("train", np.arange(store.num_windows("train")))
    meta = store.path / "data" / "zarr.json"
    text = meta.read_text()
    assert '"dimension_names"' in text
    doc = json.loads(text)
    del doc["dimension_names"]
    # zarr.json is listed in the manifest with its size and sha256: rewrite both, as the
    # earlier release's manifest had them
    old = json.dumps(doc, indent=2)
    meta.write_text(old)
    manifest_path = store.path / "windowkit.json"
    manifest = json.loads(manifest_path.read_text())
    _relist(manifest, "data/zarr.json", old.encode())
    manifest_path.write_text(json.dumps(manifest, indent=2))
    metadata = zarr.open_array(store=str(store.path / "data"), mode="r").metadata
    assert isinstance(metadata, ArrayV3Metadata) and metadata.dimension_names is None
    again = wk.open_store(store.path)
    x_old = again.windows("train", np.arange(again.num_windows("train")))
    np.testing.assert_array_equal(x_old, x_new)
    assert verify_store(store.path) == []


def _relist(manifest: dict[str, Any], name: str, blob: bytes) -> None:
    """Set ``name``'s size and sha256 in the manifest's file list to ``blob``'s."""
    (entry,) = [f for f in manifest["files"] if f["path"] == name]
    entry.update(bytes=len(blob), sha256=hashlib.sha256(blob).hexdigest())


def test_xarray_opens_a_zarr_store_as_it_is(tmp_path: Path) -> None:
    """``xr.open_zarr(STORE)``: a Dataset whose ``data`` has the dimensions
    ``row`` and ``feature``, the source's column names as the ``feature``
    coordinate, and the store's rows; no warning about the store's other files
    (the group's metadata is consolidated)."""
    import warnings

    import pandas as pd
    import xarray as xr

    values = np.arange(80, dtype=np.float32).reshape(40, 2)
    frame = pd.DataFrame({"id": ["a"] * 20 + ["b"] * 20, "temp": values[:, 0],
                          "wind": values[:, 1]})
    store = wk.convert(frame, tmp_path / "store", format="zarr", window=8, series_col="id")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = xr.open_zarr(store.path)
    assert ds["data"].dims == ("row", "feature")
    assert ds["feature"].values.tolist() == ["temp", "wind"]
    np.testing.assert_array_equal(ds["data"].sel(feature="wind").values, values[:, 1])
    assert verify_store(store.path) == []
    unnamed = wk.convert(values, tmp_path / "arrays", format="zarr", window=8)
    np.testing.assert_array_equal(xr.open_zarr(unnamed.path)["data"].values, values)


@pytest.mark.parametrize(("names", "bookkeeping"), [
    (["temp", "wind"], ["series", "row"]),  # the source's names
    (["row", "wind"], ["series", "_row"]),  # a bookkeeping column's name: that one gives way
    (["series", "_series"], ["__series", "row"]),
])
def test_parquet_value_columns_keep_the_source_names(tmp_path: Path, names: list[str],
                                                     bookkeeping: list[str]) -> None:
    import pandas as pd
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    values = rng.normal(size=(40, 2)).astype(np.float32)
    frame = pd.DataFrame({"id": ["a"] * 20 + ["b"] * 20, "t": list(range(20)) * 2,
                          names[0]: values[:, 0], names[1]: values[:, 1]})
    store = wk.convert(frame, tmp_path / "s", format="parquet", window=4,
                       series_col="id", time_col="t")
    parts = sorted((tmp_path / "s" / "data").glob("part-*.parquet"))
    table = pq.read_table(parts[0])
    stored = names
    assert table.column_names == [*bookkeeping, *stored]
    assert store.manifest.data["columns"] == stored
    np.testing.assert_array_equal(table.select(stored).to_pandas().to_numpy()[:20],
                                  values[:20])
    x = store.windows("train", np.arange(store.num_windows("train")))
    first = [values[s:s + 4] for s in range(17)] + [values[20 + s:24 + s] for s in range(17)]
    np.testing.assert_array_equal(x, np.stack(first))
    assert verify_store(tmp_path / "s") == []


def test_polars_and_duckdb_read_a_parquet_stores_data_as_one_table(tmp_path: Path) -> None:
    """``data/`` of a Parquet store holds its table alone (the block digests lie
    beside it), so Polars and DuckDB read the directory as it is, with the
    source's column names."""
    import duckdb
    import pandas as pd
    import polars as pl

    rng = np.random.default_rng(1)
    values = rng.normal(size=(300, 2)).astype(np.float32)
    frame = pd.DataFrame({"id": np.repeat(["a", "b", "c"], 100), "row": values[:, 0],
                          "wind": values[:, 1]})
    store = wk.convert(frame, tmp_path / "s", format="parquet", window=4, series_col="id",
                       block_rows=64)
    data = store.path / "data"
    assert sorted(p.suffix for p in data.iterdir()) == [".parquet"] * len(list(data.iterdir()))
    polars = pl.read_parquet(data).sort(["series", "_row"])
    np.testing.assert_array_equal(polars.select(["row", "wind"]).to_numpy(), values)
    (count,), = duckdb.sql(f"select count(*) from read_parquet('{data}/**')").fetchall()
    assert count == len(values)
    assert verify_store(store.path) == []
