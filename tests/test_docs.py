"""The documentation a user reads: a short README whose links into ``docs/``
resolve, a site that builds with ``mkdocs build --strict`` (API reference
included), and a performance page whose figures ``make bench`` writes."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.benchmarks import benchmark, perf_page

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PARTS = ("throughput", "shuffling", "sharding", "forecasting", "memory", "csv", "training",
         "gpu")


def test_the_readme_is_short_and_keeps_the_two_commands() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    assert "make demo" in text and "make test" in text


def test_every_docs_link_in_the_readme_resolves() -> None:
    links = re.findall(r"\]\((docs/[^)#\s]*)(?:#[^)]*)?\)", README.read_text())
    assert len(links) >= 8, links
    missing = [link for link in links if not (ROOT / link).is_file()]
    assert not missing, f"README links to missing docs pages: {missing}"


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None,
                    reason="mkdocs is not installed (pip install -e '.[docs]')")
def test_the_site_builds_strictly(tmp_path: Path) -> None:
    """Every page, link, anchor, snippet and docstring of the API reference:
    any warning fails the build."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                           "-f", str(ROOT / "mkdocs.yml"), "-d", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, env=env, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    for name in ("windowkit.convert", "windowkit.open_store", "windowkit.Store.tf_dataset",
                 "windowkit.WindowSpec", "windowkit.errors.StoreError"):
        assert f'id="{name}"' in api, name
    splits = (tmp_path / "site" / "splits" / "index.html").read_text()
    assert "grunfeld.csv" in splits  # the README's tested example, included


def _run(windows_s: float, rss: float = 800.0, **more: Any) -> dict[str, Any]:
    return {"windows_s": windows_s, "cpu_windows_s": windows_s / 2, "peak_rss_mb": rss,
            "windows": 398_100, "seconds": 398_100 / windows_s, **more}


def _measured(out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Figures for every part, saved as the benchmark saves them."""
    monkeypatch.setattr(benchmark, "OUT", out)
    formats = ("tfrecord", "zarr")
    best: dict[str, Any] = {"materialized": _run(500_001, 3000, materialized_bytes=780 * 2**20)}
    for i, f in enumerate(formats):
        best[f"{f} tf_dataset"] = _run(1_234_567 + i)
        best[f"{f} keras_dataset"] = _run(1_000_003 + i)
        best[f"{f} keras_dataset x2"] = _run(700_007 + i)
        best[f"{f} tf_dataset unchecked"] = _run(1_300_000 + i)
    benchmark._save("throughput", rounds=2, raw_bytes=24 * 2**20,
                    tf_import={"peak_rss_mb": 761.0}, best=best,
                    convert={f: {"convert_mb_s": 77.0} for f in formats},
                    disk_bytes={f: 24 * 2**20 for f in formats},
                    cpu_bars=["zarr: tf_dataset spends 1.22x keras_dataset's CPU per window "
                              "(bar 1.3x)"])
    mix = {"series": 4.8, "uniform_series": 20.0, "blocks": 2.9, "uniform_blocks": 25.0}
    benchmark._save("shuffling", rounds=2, best={
        "permuted": _run(1_500_000), **{f"{f} {m}": _run(1_876_543) for f in formats
                                        for m in ("global", "blocks")}},
        mixing={f"{f} {m}": mix for f in formats for m in ("global", "blocks")})
    shard = {"windows": 200_394, "windows_s": 300_000.0, "read_bytes": 13_200_000}
    benchmark._save("sharding", rounds=2, rows=[
        {"format": f, "mode": "blocks", "whole": {"windows_s": 277_906.0, "read_bytes": 26e6},
         "shards": [shard, shard], "together": 272_000.0, "data_mb": 25.9} for f in formats])
    benchmark._save("forecasting", rounds=25, rows=[
        {"format": f, "reader": r, "plain": 1_327_457.0, "ratio": 0.853, "low": 0.8,
         "high": 0.94, "cpu_ratio": 0.85} for f in formats for r in ("tf", "keras")])
    conv = {"convert_mb_s": 128.0, "peak_rss_mb": 157.0, "worker_peak_rss_mb": 76.0}
    benchmark._save("memory", tf_import={"peak_rss_mb": 639.0}, rows=[
        {"format": f, "gib": gib, "convert": conv, "parallel": conv,
         "tf": _run(923_456, 749 + gib), "keras": _run(989_012, 692)}
        for f in formats for gib in (0.5, 4.0)])
    csv = {"seconds": 53.0, "csv_mb_s": 44.0, "peak_rss_mb": 539.0, "rows": 30_000_000,
           "csv_bytes": 2.18 * 2**30}
    benchmark._save("csv", series=50, formats={f: csv for f in formats},
                    interleaved={**csv, "format": "zarr", "series": 50, "csv_bytes": 264 * 2**20})
    line = {"cpu_s_per_m": 1.25, "peak_over_mb": 300.0, "anon_over_mb": 290.0, "rows_mb": 256.5}
    benchmark._save("training", mib=256, series=20, rows_per_series=209_715, length=32,
                    batch=256, spill_budget_mib=64, warmup=200, steps=3000, lines=[
                        {**line, "consumer": "fit", "reader": "materialized", "format": "zarr",
                         "windows_s": 400_000.0},
                        {**line, "consumer": "fit", "reader": "default", "format": "zarr",
                         "windows_s": 390_000.0}],
                    bars=["fit, default reader: 0.97x materialized (bar 0.95x)"])
    benchmark._save("gpu", gpu="NVIDIA H100 80GB HBM3", mib=128, batch=256, warmup=40,
                    steps=400, skipped=[], rows=[
                        {"framework": "tensorflow", "reader": "materialized on /GPU:0",
                         "steps_s": 812.5, "windows_s": 208_000.0, "wait_share": 0.004,
                         "vs_ceiling": 1.0}])


def _region(page: str, part: str) -> str:
    found = re.search(rf"<!-- figures:{part} -->\n(.*?)\n<!-- /figures:{part} -->", page, re.S)
    assert found, part
    return found.group(1)


def _prose(page: str) -> str:
    return re.sub(r"<!-- figures:(\w+) -->.*?<!-- /figures:\1 -->", "", page, flags=re.S)


def test_make_bench_figures_land_on_the_performance_page(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """perf_page rewrites each measured part's region from the benchmark's JSON,
    keeps the prose and every region's markers, and rerunning changes nothing."""
    page = tmp_path / "performance.md"
    original = (ROOT / "docs" / "performance.md").read_text()
    page.write_text(original)
    _measured(tmp_path / "bench-out", monkeypatch)
    perf_page.main(["--bench-dir", str(tmp_path / "bench-out"), "--page", str(page)])
    written = page.read_text()
    assert _prose(written) == _prose(original)
    for part in PARTS:
        region = _region(written, part)
        assert region != _region(original, part), part
        for table in re.findall(r"(?:^\|.*\n?)+", region, re.M):  # each table's rows
            assert len({line.count("|") for line in table.splitlines()}) == 1, (part, table)
    x, dash = perf_page.X, perf_page.DASH
    throughput = _region(written, "throughput")
    assert f"1,234,567 | 617,284 | **2.47{x}**" in throughput  # vs 500,001 plain; CPU
    assert "- zarr: tf_dataset spends 1.22x keras_dataset's CPU per window" in throughput
    assert f"0.85{x} (0.80{dash}0.94)" in _region(written, "forecasting")
    assert "| TFRecord `tf_dataset` | 1,234,567 | 1,300,000 | 0.950 |" in _region(
        written, "throughput")  # per-block checks on against off
    assert "+4 / +0 MB" in _region(written, "memory")  # peak RSS growth, 0.5 to 4 GiB
    assert "2.18 GiB long CSV (30,000,000 rows of 50 series" in _region(written, "csv")
    assert f"| fit | Zarr default | 390,000 | 0.97{x} | 1.25 |" in _region(written, "training")
    assert f"| tensorflow | materialized on /GPU:0 | 812.5 | 208,000 | 0.4% | 1.00{x} |" in (
        _region(written, "gpu"))
    perf_page.main(["--bench-dir", str(tmp_path / "bench-out"), "--page", str(page)])
    assert page.read_text() == written


def test_parts_not_measured_keep_their_figures(tmp_path: Path) -> None:
    page = tmp_path / "performance.md"
    original = (ROOT / "docs" / "performance.md").read_text()
    page.write_text(original)
    perf_page.main(["--bench-dir", str(tmp_path / "nothing"), "--page", str(page)])
    assert page.read_text() == original
    page.write_text(original.replace("<!-- figures:csv -->", ""))
    (tmp_path / "nothing").mkdir()
    (tmp_path / "nothing" / "csv.json").write_text('{"series": 50, "formats": {}}')
    with pytest.raises(SystemExit, match="no <!-- figures:csv -->"):
        perf_page.main(["--bench-dir", str(tmp_path / "nothing"), "--page", str(page)])
