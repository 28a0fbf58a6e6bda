"""This tree against an earlier release, side by side in one run (``make bench-vs BASE=REF``).

The earlier release is checked out as a git worktree; both convert the ``make bench``
throughput data, then each round runs every format's ``tf_dataset`` and
``keras_dataset`` for one epoch with the release, with this tree, and with this tree's
per-block checks off, one fresh process each, alternating so all three see the same
machine load. Prints windows/s (best of the rounds, and the median of the paired
ratios) and peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.benchmarks.benchmark import OUT, _make_throughput_data

HERE = Path(__file__).resolve().parents[2]
SIDES = ("release", "checks on", "checks off")


def _child(tree: Path, *args: str, checks: bool = True) -> dict[str, Any]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(tree),
           "WINDOWKIT_BENCH_CHECKS": "on" if checks else "off"}
    proc = subprocess.run([sys.executable, "-m", "tests.benchmarks.benchmark", "child", *args],
                          cwd=tree, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"child {args} in {tree} failed:\n{proc.stderr[-3000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.vs_release")
    parser.add_argument("base", help="the git ref of the earlier release")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    old = (OUT / f"release-{args.base}").resolve()
    if not old.exists():
        subprocess.run(["git", "-C", str(HERE), "worktree", "add", "--detach", str(old),
                        args.base], check=True)
    source = (OUT / "throughput-src").resolve()
    _make_throughput_data(source)
    trees = {"release": old, "checks on": HERE, "checks off": HERE}
    stores = {}
    for fmt in ("tfrecord", "zarr", "parquet"):
        for side, tree in (("release", old), ("checks on", HERE)):
            stores[side, fmt] = str((OUT / f"vs-{side.split()[0]}-{fmt}").resolve())
            _child(tree, "convert", str(source / "*.npy"), stores[side, fmt], fmt)
        stores["checks off", fmt] = stores["checks on", fmt]
    results: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for _ in range(args.rounds):
        for fmt in ("tfrecord", "zarr", "parquet"):
            for reader, child in (("tf_dataset", ("windowkit",)), ("keras_dataset", ("keras",))):
                extra = ("epoch", "1") if reader == "keras_dataset" else ("epoch",)
                for side in SIDES:
                    got = _child(trees[side], *child, stores[side, fmt], *extra,
                                 checks=side != "checks off")
                    results.setdefault((fmt, reader, side), []).append(got)
    _report(results, args.base, args.rounds)


def _report(results: dict[tuple[str, str, str], list[dict[str, Any]]], base: str,
            rounds: int) -> None:
    print(f"this tree vs {base}: windows/s, best of {rounds} alternating rounds; "
          "paired: median of the per-round ratios")
    print(f"{'reader':<24}{'release':>11}{'checks on':>11}{'off':>11}{'on/release':>12}"
          f"{'paired':>8}{'on/off':>8}{'RSS release':>13}{'RSS on':>8}")
    for fmt in ("tfrecord", "zarr", "parquet"):
        for reader in ("tf_dataset", "keras_dataset"):
            runs = {side: results[fmt, reader, side] for side in SIDES}
            best = {side: max(r["windows_s"] for r in runs[side]) for side in SIDES}
            rss = {side: max(r["peak_rss_mb"] for r in runs[side]) for side in SIDES}
            paired = statistics.median(a["windows_s"] / b["windows_s"] for a, b in
                                       zip(runs["checks on"], runs["release"], strict=True))
            print(f"{fmt + ' ' + reader:<24}{best['release']:>11,.0f}{best['checks on']:>11,.0f}"
                  f"{best['checks off']:>11,.0f}{best['checks on'] / best['release']:>11.3f}x"
                  f"{paired:>7.3f}x{best['checks on'] / best['checks off']:>7.3f}x"
                  f"{rss['release']:>10.0f} MB{rss['checks on']:>5.0f} MB")


if __name__ == "__main__":
    main()
