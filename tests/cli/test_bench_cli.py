"""``windowkit bench`` on every store: forecasting stores (dict batches with
known-future and static parts) in every format, reader and shuffle; small
stores (fewer warm-up batches, said so); ``--batches`` beyond one epoch (more
epochs, counted); an empty split (one line); plots with data in every panel."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

import windowkit as wk
from windowkit.bench import BenchReport, Stage, plot, plot_data, run_bench
from windowkit.cli import main

SPEC = wk.WindowSpec(6, stride=2, horizon=3)


def _tagged(lengths: list[int]) -> list[np.ndarray]:
    """Feature 0: the series; 1: the row (known ahead); 2, 3: values."""
    rng = np.random.default_rng(4)
    return [np.column_stack([np.full(n, s), np.arange(n), rng.normal(size=n),
                             rng.normal(size=n)]).astype(np.float32)
            for s, n in enumerate(lengths)]


def _forecasting(path: Path, fmt: str, lengths: list[int], **kwargs: Any) -> wk.Store:
    """A store with known-future columns, a target column and a static feature."""
    return wk.convert(_tagged(lengths), path, format=fmt, window=SPEC, block_rows=64,
                      known_columns=["1", "3"], target_columns=["2"],
                      static={"area": [float(k + 1) for k in range(len(lengths))]}, **kwargs)


@pytest.fixture
def store(tmp_path: Path, concept_format: str) -> wk.Store:
    return _forecasting(tmp_path / "s", concept_format, [300, 41, 222, 9, 160])  # 347 windows


def bench(*args: object) -> Any:
    return CliRunner().invoke(main, ["bench", *[str(a) for a in args]])


def _bench_json(*args: object) -> dict[str, Any]:
    result = bench(*args, "--json")
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.output))


def _window_bytes(store: wk.Store) -> int:
    """Bytes of one window's every part (inputs, future_known, static, series, y)."""
    x, y = store.windows("train", [0])
    assert set(x) == {"inputs", "future_known", "static", "series"}
    return sum(v.nbytes for v in x.values()) + y.nbytes


@pytest.mark.parametrize("reader", ["tf", "keras"])
@pytest.mark.parametrize("shuffle", ["blocks", "global"])
def test_bench_reads_dict_batches(store: wk.Store, concept_format: str, reader: str,
                                  shuffle: str) -> None:
    report = _bench_json(store.path, "--reader", reader, "--shuffle", shuffle, "--batch-size",
                         16, "--batches", 5, "--warmup", 1)
    assert report["format"] == concept_format and report["reader"] == reader
    assert report["run"]["windows"] == 5 * 16
    assert report["window_bytes"] == _window_bytes(store)  # every part counted
    assert report["run"]["bytes"] == 5 * 16 * _window_bytes(store)
    assert report["warmup"] == 1 and report["epochs"] == 1
    assert report["batches_per_epoch"] == -(-347 // 16)
    read, gather = report["stages"]
    assert read["windows"] == 347 and gather["windows"] == 5 * 16
    assert gather["bytes"] == 5 * 16 * _window_bytes(store)
    assert 1 <= report["mixing"]["series"] <= 5 and report["mixing"]["uniform_series"] > 1


def test_a_small_store_at_the_defaults(tmp_path: Path, concept_format: str) -> None:
    """143 windows, one batch of 256: no warm-up (said so), the whole epoch
    timed, mixing not measured (no full batch; said so), the baseline compared."""
    store = _forecasting(tmp_path / "s", concept_format, [120, 80, 110])
    assert store.num_windows("train") == 143
    result = bench(store.path, "--baseline")
    assert result.exit_code == 0, result.output
    assert "  warm-up 0 batches, not 5: at most a quarter of an epoch, and the split has " \
           "1 batch of 256" in result.output
    assert re.search(r"^  143 windows in 1 batches, .* windows/s", result.output, re.M)
    assert "mixing not measured: the split has no full batch of 256 windows" in result.output
    assert re.search(r"windowkit is \d+\.\d\dx$", result.output, re.M)
    report = _bench_json(store.path, "--reader", "keras", "--shuffle", "global",
                         "--batch-size", 32, "--baseline")
    assert report["warmup"] == 1 and report["warmup_asked"] == 5  # 5 batches: 1 warm-up
    assert report["batches_per_epoch"] == 5 and report["run"]["windows"] == 143 - 32
    assert report["mixing"] is not None and report["notes"] == []
    assert report["baseline"]["windows"] == report["run"]["windows"]
    assert report["ratio_to_baseline"] > 0


@pytest.mark.parametrize("reader", ["tf", "keras"])
def test_batches_beyond_one_epoch_run_more_epochs(store: wk.Store, reader: str) -> None:
    """11 batches an epoch (the last of 27 windows): 2 warm-up then 30 timed
    are 32 batches, 3 epochs; the windows are those batches' windows."""
    report = _bench_json(store.path, "--reader", reader, "--batch-size", 32, "--batches", 30,
                         "--warmup", 2, "--baseline")
    sizes = [32] * 10 + [347 - 320]
    assert report["batches_per_epoch"] == 11 and report["epochs"] == 3
    assert report["run"]["windows"] == sum((sizes * 3)[2:32])
    assert report["baseline"]["windows"] == report["run"]["windows"]
    text = bench(store.path, "--reader", reader, "--batch-size", 32, "--batches", 30,
                 "--warmup", 2).output
    assert "  timed 30 batches after 2 warm-up: 3 epochs of 11 batches read" in text, text


def test_an_empty_split_is_one_line(tmp_path: Path, concept_format: str) -> None:
    """A 70/30 split of short series leaves ``val`` empty: one line, exit 2, no
    advice about warm-up or batch size."""
    store = _forecasting(tmp_path / "s", concept_format, [20, 24, 22], splits="train=0.7,val=0.3")
    assert store.num_windows("val") == 0 and store.num_windows("train") > 0
    for reader in ("tf", "keras"):
        result = bench(store.path, "--split", "val", "--reader", reader)
        assert result.exit_code == 2, result.output
        assert result.output.count("\n") == 1, result.output
        assert "split 'val' of " in result.output and "has no windows" in result.output
        assert "--warmup" not in result.output and "--batch-size" not in result.output


@pytest.mark.parametrize("reader", ["tf", "keras"])
def test_plot_of_a_short_run_has_data_in_every_panel(tmp_path: Path, reader: str) -> None:
    store = _forecasting(tmp_path / "s", "zarr", [120, 80, 110])
    png = tmp_path / "bench.png"
    result = bench(store.path, "--reader", reader, "--batch-size", 64, "--plot", png)
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = run_bench(store, batch_size=64, reader=reader)
    assert len(report.run.spans) == 3  # 3 batches, no warm-up
    data = plot(report, tmp_path / "again.png")
    assert [label for label, _ in data.timeline] == [
        "read+decode (alone)", "gather (alone)", "consume: waiting for a batch"]
    assert all(len(spans) > 0 for _, spans in data.timeline)
    seconds, rate = data.throughput
    assert data.per_batch and len(seconds) == len(rate) == 3
    assert np.all(np.isfinite(rate)) and np.all(rate > 0)


def test_plot_of_a_long_run_is_binned_and_full() -> None:
    """Many batches: the rate over time in bins, every batch's windows in them."""
    spans = [(0.01 * i, 0.01 * i + 0.002) for i in range(200)]
    run = Stage("tf reader", spans[-1][1], 200 * 8, 200 * 8 * 40, spans)
    report = BenchReport(store="s", format="zarr", reader="tf", shuffle="blocks",
                         split="train", batch_size=8, window_bytes=40, run=run,
                         peak_rss_mb=1.0, stages=[])
    data = plot_data(report)
    edges, rate = data.throughput
    assert not data.per_batch and len(edges) == len(rate) == 51
    assert np.sum(rate[:-1] * np.diff(edges)) == pytest.approx(200 * 8)


def test_shuffle_is_spelt_as_the_readers_argument(store: wk.Store) -> None:
    """``--shuffle`` takes the readers' ``shuffle=`` values (``true``, ``global``,
    ``blocks``, ``false``); the earlier words still work; anything else is one line."""
    report = _bench_json(store.path, "--shuffle", "false", "--batches", "2")
    assert report["shuffle"] == "false" and report["mode"] == "index order"
    earlier = _bench_json(store.path, "--shuffle", "default", "--batches", "2")
    assert earlier["shuffle"] == "true"
    result = bench(store.path, "--shuffle", "sometimes")
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "windowkit: error: shuffle must be one of true, global, blocks, false, got 'sometimes'"]
