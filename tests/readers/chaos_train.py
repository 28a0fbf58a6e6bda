"""A small training run that a chaos test kills with SIGKILL and starts again.

``python -m tests.readers.chaos_train TRAINER STORE WORK KILL_AT BUDGET [RANKS]``:
trains 3 epochs of ``STORE``'s train split with ``TRAINER`` (``keras``,
``torch``, ``tf``, ``grain``, ``torch-ranks``), checkpointing after every
step through the trainer's own checkpoint, together with the windows each
committed step trained (one atomic file, so what is recorded is what the
checkpoint holds). At global step ``KILL_AT`` (-1: never) it sends itself
SIGKILL, before the step. Started again, it resumes from its last checkpoint
with a reader whose ``memory_budget`` is ``BUDGET`` bytes (0: the default);
``torch-ranks`` runs ``RANKS`` ranks stepping together, resumed from rank
0's state as Lightning does.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import numpy as np

import windowkit as wk

EPOCHS, BATCH, SEED = 3, 16, 11


def ids(x: Any) -> list[int]:
    """The windows of a batch (NumPy, torch or tf; ``x`` or ``(x, y)``), by their first value."""
    x = x[0] if isinstance(x, tuple | list) else x
    x = x.numpy() if hasattr(x, "numpy") else np.asarray(x)
    return [int(v) for v in x[:, 0, 0]]


class Record:
    """The committed steps: ``[epoch, window ids]`` each, written atomically."""

    def __init__(self, work: Path) -> None:
        self.path = work / "seen.json"
        self.seen: list[Any] = json.loads(self.path.read_text()) if self.path.exists() else []

    def commit(self, epoch: int, batch: Any, extra: Any = None) -> None:
        self.seen.append([epoch, ids(batch)])
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.seen))
        os.replace(tmp, self.path)


def maybe_die(step: int, kill_at: int) -> None:
    if step == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)


def train_torch(store: wk.Store, work: Path, kill_at: int, budget: int | None) -> None:
    import torch
    from torchdata.stateful_dataloader import StatefulDataLoader

    ds = store.torch_dataset("train", BATCH, seed=SEED, memory_budget=budget)
    loader = StatefulDataLoader(ds, batch_size=None, num_workers=2, sampler=ds.sampler(),
                                multiprocessing_context="fork")
    record, ckpt = Record(work), work / "torch.pt"
    saved = torch.load(ckpt, weights_only=False) if ckpt.exists() else {"epoch": 0}
    epoch = saved["epoch"]
    if saved.get("loader") is not None:
        loader.load_state_dict(saved["loader"])  # the dataset's epoch and order with it
    else:
        loader.sampler.set_epoch(epoch)

    def save(state: dict[str, Any]) -> None:
        torch.save(state, work / "tmp.pt")
        os.replace(work / "tmp.pt", ckpt)

    while epoch < EPOCHS:
        for x in loader:
            maybe_die(len(record.seen), kill_at)
            save({"epoch": epoch, "loader": loader.state_dict()})
            record.commit(epoch, x)  # a kill between the two re-trains one step: see the test
        epoch += 1
        loader.sampler.set_epoch(epoch)
        save({"epoch": epoch, "loader": None})


def train_keras(store: wk.Store, work: Path, kill_at: int, budget: int | None) -> None:
    import keras

    record = Record(work)
    ds = store.keras_dataset("train", BATCH, seed=SEED, memory_budget=budget)

    class Model(keras.Model):
        def __init__(self) -> None:
            super().__init__()
            self.dense = keras.layers.Dense(1)

        def call(self, x: Any) -> Any:
            return self.dense(keras.ops.reshape(x, (-1, 12)))

        def train_step(self, data: Any) -> dict[str, Any]:
            maybe_die(len(record.seen), kill_at)
            self.pending = data
            return {"loss": keras.ops.convert_to_tensor(0.0)}

    class Commit(keras.callbacks.Callback):  # after the backup has saved this step
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            record.commit(ds.position[0], model.pending)

    model = Model()
    model(np.zeros((1, 6, 2)))  # built, so that its weights can be backed up
    model.compile("sgd", "mse", run_eagerly=True)
    model.fit(ds, epochs=EPOCHS, verbose=0, shuffle=False,
              callbacks=[ds.backup_and_restore(work / "backup", save_freq=1), Commit()])


def train_tf(store: wk.Store, work: Path, kill_at: int, budget: int | None) -> None:
    import tensorflow as tf

    record = Record(work)
    ds = store.tf_dataset("train", BATCH, seed=SEED, memory_budget=budget)
    per_epoch = store.num_windows("train") // BATCH + bool(store.num_windows("train") % BATCH)
    iterator = iter(ds.repeat(EPOCHS).map(lambda x: x * 1).prefetch(2))
    ckpt = tf.train.Checkpoint(iterator=iterator)
    manager = tf.train.CheckpointManager(ckpt, str(work / "tf"), max_to_keep=1)
    if manager.latest_checkpoint:
        ckpt.restore(manager.latest_checkpoint)

    @tf.function
    def step(x: Any) -> Any:
        return tf.reduce_mean(x)

    for x in iterator:
        done = len(record.seen)
        maybe_die(done, kill_at)
        step(x)
        manager.save()
        record.commit(done // per_epoch, x)


def train_grain(store: wk.Store, work: Path, kill_at: int, budget: int | None) -> None:
    record = Record(work)
    src = store.grain_batches("train", BATCH, seed=SEED, epochs=EPOCHS, memory_budget=budget)
    iterator = iter(src.iter_dataset())
    state_path = work / "grain.json"
    if state_path.exists():
        iterator.set_state(json.loads(state_path.read_text()))
    for x in iterator:
        done = len(record.seen)
        maybe_die(done, kill_at)
        state_path.with_suffix(".tmp").write_text(json.dumps(iterator.get_state()))
        os.replace(state_path.with_suffix(".tmp"), state_path)
        record.commit(done // src.batches_per_epoch, x)


def train_torch_ranks(store: wk.Store, work: Path, kill_at: int, budget: int | None,
                      ranks: int) -> None:
    """``ranks`` ranks in one process, stepping together (each its own
    loader); a step commits every rank's windows; rank 0's loader state is
    the checkpoint every rank restores (Lightning's way)."""
    import torch
    from torchdata.stateful_dataloader import StatefulDataLoader

    datasets = [store.torch_dataset("train", BATCH, seed=SEED, memory_budget=budget, rank=r,
                                    world_size=ranks) for r in range(ranks)]
    loaders = [StatefulDataLoader(ds, batch_size=None, sampler=ds.sampler()) for ds in datasets]
    record, ckpt = Record(work), work / "torch.pt"
    saved = torch.load(ckpt, weights_only=False) if ckpt.exists() else {"epoch": 0}
    epoch = saved["epoch"]
    for loader in loaders:
        if saved.get("loader") is not None:
            loader.load_state_dict(saved["loader"])
        else:
            loader.sampler.set_epoch(epoch)
    while epoch < EPOCHS:
        for batches in zip(*loaders, strict=True):
            maybe_die(len(record.seen), kill_at)
            torch.save({"epoch": epoch, "loader": loaders[0].state_dict()}, work / "tmp.pt")
            os.replace(work / "tmp.pt", ckpt)
            record.commit(epoch, torch.cat(batches))
        epoch += 1
        for loader in loaders:
            loader.sampler.set_epoch(epoch)
        torch.save({"epoch": epoch, "loader": None}, work / "tmp.pt")
        os.replace(work / "tmp.pt", ckpt)


TRAINERS = {"torch": train_torch, "keras": train_keras, "tf": train_tf, "grain": train_grain}

if __name__ == "__main__":
    trainer, store_path, work_dir, kill, budget_bytes = sys.argv[1:6]
    store_, work_, budget_ = wk.open_store(store_path), Path(work_dir), int(budget_bytes) or None
    if trainer == "torch-ranks":
        train_torch_ranks(store_, work_, int(kill), budget_, int(sys.argv[6]))
    else:
        TRAINERS[trainer](store_, work_, int(kill), budget_)
