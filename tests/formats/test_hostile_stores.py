"""Hostile stores beyond the per-format contract (tests/hostile_contract.py,
``HostileStoreTests``, run for every format): the commands on a hostile Parquet
store say one line, and what conversion writes always passes the checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import windowkit as wk
from tests.hostile_contract import hostile_store, mutated
from windowkit.cli import main
from windowkit.verify import verify_store


@pytest.fixture(scope="module")
def hostile_parquet(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict]]:
    """The contract's small Parquet store (by format name)."""
    return {"parquet": hostile_store(tmp_path_factory.mktemp("pristine") / "parquet", "parquet")}


#: What used to end in a traceback (RecursionError, KeyError, ArrowInvalid).
_TRACEBACKS = ["manifest nested 100k deep", "index is series.parquet", "index is a data file",
               "index without start", "index series as strings", "series rows as int32",
               "series without row_offset", "series is an index table"]


@pytest.mark.parametrize("name", _TRACEBACKS)
def test_the_commands_say_one_line(hostile_parquet: dict[str, tuple[Path, dict]],
                                   tmp_path: Path, name: str) -> None:
    """``verify`` lists problems (exit 1), ``inspect`` and ``bench`` refuse with one
    line (exit 2); never a traceback."""
    root, _ = mutated(hostile_parquet, tmp_path, name, "parquet")
    for fast in ([], ["--fast"]):
        result = CliRunner().invoke(main, ["verify", str(root), "-q", *fast])
        assert result.exit_code == 1, result.output
        lines = result.output.splitlines()
        assert lines and all(line.startswith(f"windowkit: verify: {root}") for line in lines), \
            result.output
    for command in (["inspect", str(root)], ["bench", str(root), "--reader", "keras",
                                             "--batch-size", "8", "--warmup", "1",
                                             "--shuffle", "none"]):
        result = CliRunner().invoke(main, command)
        assert "Traceback" not in result.output, result.output
        if result.exit_code != 0:  # inspect reads the manifest, not the tables
            assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
            assert result.output.startswith(f"windowkit: error: {root}"), result.output


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int64", "uint8"])
def test_statistics_of_real_values_pass_the_checks(tmp_path: Path, dtype: str) -> None:
    """A constant column (std 0, or a rounding error's worth), huge and tiny values
    and every dtype: what conversion writes always opens and normalizes finitely."""
    rng = np.random.default_rng(1)
    info = np.finfo(dtype) if np.dtype(dtype).kind == "f" else np.iinfo(dtype)
    big = min(float(info.max) / 8, 1e30)
    values = np.clip(np.stack([np.full(500, 0.1), rng.normal(size=500) * big,
                               rng.normal(size=500) * 1e-3, np.full(500, big)], axis=1),
                     float(info.min), float(info.max)).astype(dtype)
    store = wk.convert([values[:300], values[300:]], tmp_path / "s", format="zarr",
                       window=wk.WindowSpec(4), splits="train=0.5,val=0.5")
    x = wk.open_store(store.path).windows("train", np.arange(store.num_windows("train")),
                                          normalize=True)
    assert np.isfinite(x).all()
    assert verify_store(store.path) == []
