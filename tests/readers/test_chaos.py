"""Chaos: a small training loop in each trainer (Keras ``fit`` with
``backup_and_restore``, a torch loop with ``StatefulDataLoader`` and 2
workers, a ``tf.function`` loop with ``tf.train.Checkpoint`` behind ``.map``,
Grain's ``src.iter_dataset()``) is killed with SIGKILL at 2 random steps
across 3 epochs and started again from its last checkpoint each time; the
Keras, torch and Grain runs come back with another ``memory_budget`` each time
(another epoch order, had it not travelled with the checkpoint). The steps
each run committed, together, are batch for batch the uninterrupted run's, so
each epoch trains every window exactly once. Ranks stepping together, resumed
from rank 0's torch state on 2 and 1 ranks in turn, train every window of each
epoch once (a padded rank's repeats aside). (Lightning DDP, killed at 2 random
steps and resumed from its checkpoint on 2 ranks, then on 1: ``test_trainers.py``.)
Each run starts a new process, most of a run's time: two kills already go
through every budget (one per run) and both rank counts; ``make test-slow``
runs each with 10 kills."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import windowkit as wk
from tests.helpers import numbered_series
from tests.readers.chaos_train import BATCH, EPOCHS, SEED, ids

pytest.importorskip("torch")
pytest.importorskip("grain")

ROOT = Path(__file__).resolve().parents[2]
BUDGETS = (6_000, 24_000, 0)  # block groups of two sizes, and the machine's default
ADOPTING = {"keras", "torch", "grain"}  # readers that go on in a saved order under another budget


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> wk.Store:
    path = tmp_path_factory.mktemp("chaos") / "store"
    return wk.convert(numbered_series([300, 200, 140], features=2), path, format="zarr",
                      window=wk.WindowSpec(6), block_rows=16)


def uninterrupted(store: wk.Store, budget: int) -> list[list[object]]:
    ds = store.keras_dataset("train", BATCH, seed=SEED, memory_budget=budget or None)
    return [[epoch, ids(ds.batches.batch_at(epoch, i))]
            for epoch in range(EPOCHS) for i in range(ds.batches.batches_in(epoch))]


def chaos(trainer: str, store: wk.Store, work: Path, kills: int, seed: int) -> list[object]:
    """Runs ``trainer`` until it finishes, killed at ``kills`` random steps
    (``torch-ranks``: on 2 ranks, then 1, in turn)."""
    steps = len(uninterrupted(store, BUDGETS[0]))
    if trainer == "torch-ranks":
        steps //= 2  # each run on 2 ranks or 1: at least half the steps of one
    at = sorted(np.random.default_rng(seed).choice(np.arange(1, steps - 1), kills,
                                                   replace=False).tolist())
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "TF_CPP_MIN_LOG_LEVEL": "3", "KERAS_BACKEND": "tensorflow"}
    for run, kill_at in enumerate([*at, -1]):
        budget = BUDGETS[run % len(BUDGETS)] if trainer in ADOPTING else BUDGETS[0]
        proc = subprocess.run(
            [sys.executable, "-m", "tests.readers.chaos_train", trainer, str(store.path),
             str(work), str(kill_at), str(budget), str(2 - run % 2)],
            env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
        want = -9 if kill_at >= 0 else 0
        assert proc.returncode == want, (trainer, run, kill_at, proc.stderr[-3000:])
    return list(json.loads((work / "seen.json").read_text()))


@pytest.mark.parametrize("trainer", ["keras", "torch", "tf", "grain"])
def test_killed_twice_each_epoch_is_the_uninterrupted_one(
        store: wk.Store, tmp_path: Path, trainer: str) -> None:
    seen = chaos(trainer, store, tmp_path, kills=2, seed=len(trainer))
    assert seen == uninterrupted(store, BUDGETS[0])


@pytest.mark.parametrize("kills", [3, pytest.param(10, marks=pytest.mark.slow)])
def test_ranks_resumed_on_another_rank_count_train_each_window_once_an_epoch(
        store: wk.Store, tmp_path: Path, kills: int) -> None:
    seen = chaos("torch-ranks", store, tmp_path, kills=kills, seed=7 + kills)
    want = sorted({w for _, batch in uninterrupted(store, 0) for w in batch})
    for epoch in range(EPOCHS):
        got = [w for e, batch in seen if e == epoch for w in batch]
        assert sorted(set(got)) == want, f"windows missing from epoch {epoch}"
        assert len(got) - len(want) <= 2 * (kills + 1), f"windows read twice in epoch {epoch}"


@pytest.mark.slow
@pytest.mark.parametrize("trainer", ["keras", "torch", "tf", "grain"])
def test_killed_ten_times_each_epoch_is_the_uninterrupted_one(
        store: wk.Store, tmp_path: Path, trainer: str) -> None:
    seen = chaos(trainer, store, tmp_path, kills=10, seed=100 + len(trainer))
    assert seen == uninterrupted(store, BUDGETS[0])
