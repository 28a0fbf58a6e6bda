"""``make bench-convergence`` in miniature: each of the four input pipelines
trains both tasks for a few steps on little data; the curves are finite, the
JSON holds every mode, the plots are PNG files, and ``perf_page`` writes the
figures into the convergence region of the shuffling page."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from tests.benchmarks import convergence, perf_page

ROOT = Path(__file__).resolve().parent.parent


def test_every_mode_trains_and_the_figures_land_on_the_shuffling_page(tmp_path: Path) -> None:
    out, img, docs = tmp_path / "bench-out", tmp_path / "img", tmp_path / "docs"
    convergence.main(["--steps", "4", "--eval-every", "2", "--seeds", "1", "--rows", "400",
                      "--val-windows", "64", "--bench-dir", str(out), "--img-dir", str(img)])
    figures = json.loads((out / "convergence.json").read_text())
    assert set(figures["tasks"]) == set(convergence.TASKS)
    assert {"materialized", "default", "global", "none"} <= set(perf_page.CONVERGENCE_MODES)
    for name, task in figures["tasks"].items():
        assert list(task["curves"]) == list(perf_page.CONVERGENCE_MODES), name
        for mode, runs in task["curves"].items():
            assert len(runs["0"]) == 3 and all(math.isfinite(v) for v in runs["0"]), mode
            assert task["curves"]["materialized"]["0"][0] == runs["0"][0]  # same initial model
        assert task["ratio"]["materialized"] == 1.0
        assert task["budget"] * 4 <= task["split_bytes"]  # global: the split does not fit
        assert (img / f"convergence-{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    docs.mkdir()
    page = docs / "shuffling.md"
    page.write_text((ROOT / "docs" / "shuffling.md").read_text())
    performance = docs / "performance.md"
    performance.write_text((ROOT / "docs" / "performance.md").read_text())
    perf_page.main(["--bench-dir", str(out), "--page", str(performance), "--docs", str(docs)])
    assert performance.read_text() == (ROOT / "docs" / "performance.md").read_text()
    found = re.search(r"<!-- figures:convergence -->\n(.*?)\n<!-- /figures:convergence -->",
                      page.read_text(), re.S)
    assert found is not None
    region = found.group(1)
    for tag, label in perf_page.CONVERGENCE_MODES.values():
        assert f"| {tag} {label} |" in region, label
    assert "![validation loss, forecast](img/convergence-forecast.png)" in region
    table = [line for line in region.splitlines() if line.startswith("|")]
    assert len({line.count("|") for line in table}) == 1
    assert len(table) == 2 + len(perf_page.CONVERGENCE_MODES)
