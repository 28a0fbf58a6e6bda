"""Trainers' defaults over ``Store.torch_dataset``: two real processes on
127.0.0.1 (gloo, CPU) under PyTorch Lightning (``ddp_spawn`` and ``ddp``, the
loader built in ``train_dataloader()``, ``use_distributed_sampler`` left on)
and Hugging Face Accelerate (``accelerator.prepare(dataloader)``): every
window once per epoch across the ranks, a new order each epoch, ranks step
together."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("lightning")
pytest.importorskip("accelerate")

import windowkit as wk
from tests.conftest import oracle_windows
from tests.helpers import free_ports, numbered_series

ROOT = Path(__file__).resolve().parents[2]
LENGTHS = [300, 170, 9, 140]
SPEC = wk.WindowSpec(5, stride=2, horizon=2)
EPOCHS = 2

_LIGHTNING = textwrap.dedent("""
    import json, sys
    import lightning as L, torch
    import windowkit as wk

    store_path, out, strategy = sys.argv[1], sys.argv[2], sys.argv[3]

    class Model(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(15, 6)
            self.seen = []

        def train_dataloader(self):  # where Lightning's docs build the loader
            ds = wk.open_store(store_path).torch_dataset("train", 16, seed=5)
            return torch.utils.data.DataLoader(ds, batch_size=None, sampler=ds.sampler())

        def training_step(self, batch, index):
            x, y = batch
            self.seen.append((self.current_epoch, x.flatten(1).numpy().tolist()))
            return torch.nn.functional.mse_loss(self.layer(x.flatten(1)), y.flatten(1))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def on_train_end(self):
            with open(f"{out}.{self.global_rank}", "w") as f:
                json.dump({"rank": self.global_rank, "seen": self.seen}, f)

    if __name__ == "__main__":
        trainer = L.Trainer(devices=2, accelerator="cpu", strategy=strategy, max_epochs=EPOCHS,
                            logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(Model())
""").replace("EPOCHS", str(EPOCHS))

_ACCELERATE = textwrap.dedent("""
    import json, os, sys
    import torch
    import windowkit as wk
    from accelerate import Accelerator

    store_path, out, rank = sys.argv[1], sys.argv[2], sys.argv[3]
    accelerator = Accelerator(cpu=True)
    ds = wk.open_store(store_path).torch_dataset("train", 16, seed=5)
    # Accelerate shards a loader's batches, so the loader hands it one batch an item
    loader = torch.utils.data.DataLoader(ds, batch_size=1, collate_fn=ds.collate)
    model = torch.nn.Linear(15, 6)
    model, optimizer, loader = accelerator.prepare(
        model, torch.optim.SGD(model.parameters(), lr=0.01), loader)
    seen = []
    for epoch in range(EPOCHS):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x.flatten(1)), y.flatten(1))
            accelerator.backward(loss); optimizer.step(); optimizer.zero_grad()
            seen.append((epoch, x.flatten(1).numpy().tolist()))
    with open(f"{out}.{accelerator.process_index}", "w") as f:
        json.dump({"rank": accelerator.process_index, "seen": seen}, f)
""").replace("EPOCHS", str(EPOCHS))


def _check(store_series: list[np.ndarray], outs: list[Path]) -> None:
    """Each epoch: ranks disjoint, together every window, at most one window
    repeated per rank, equal step counts; epochs in different orders."""
    ranks = [json.loads(p.read_text()) for p in outs]
    x, _ = oracle_windows(store_series, SPEC)
    want = {tuple(np.round(row, 4)) for row in x.reshape(len(x), -1).tolist()}
    orders = []
    for epoch in range(EPOCHS):
        per_rank = [[tuple(np.round(row, 4)) for e, batch in r["seen"] if e == epoch
                     for row in batch] for r in ranks]
        steps = [sum(1 for e, _ in r["seen"] if e == epoch) for r in ranks]
        assert steps[0] == steps[1] > 0
        keys = [set(rows) for rows in per_rank]
        assert not keys[0] & keys[1], "a window read by both ranks"
        assert keys[0] | keys[1] == want, "windows missing from the epoch"
        assert all(len(rows) - len(set(rows)) <= 1 for rows in per_rank)
        orders.append(per_rank[0])
    assert orders[0] != orders[1], "epoch 1 repeated epoch 0's order"


def _store(tmp_path: Path) -> tuple[wk.Store, list[np.ndarray]]:
    series = [s.astype(np.float32) for s in numbered_series(LENGTHS, features=3)]
    return wk.convert(series, tmp_path / "s", format="zarr", window=SPEC), series


@pytest.mark.parametrize("strategy", ["ddp_spawn", "ddp"])
def test_lightning_defaults_are_exact(tmp_path: Path, strategy: str) -> None:
    store, series = _store(tmp_path)
    script = tmp_path / "fit.py"
    script.write_text(_LIGHTNING)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_ports()[0])}
    proc = subprocess.run([sys.executable, str(script), str(store.path), str(tmp_path / "out"),
                           strategy], env=env, capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _check(series, [tmp_path / "out.0", tmp_path / "out.1"])


def test_accelerate_prepare_is_exact(tmp_path: Path) -> None:
    store, series = _store(tmp_path)
    script = tmp_path / "train.py"
    script.write_text(_ACCELERATE)
    port = str(free_ports()[0])
    procs = []
    for rank in range(2):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "RANK": str(rank),
               "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
        procs.append(subprocess.Popen([sys.executable, str(script), str(store.path),
                                       str(tmp_path / "out"), str(rank)], env=env,
                                      stderr=subprocess.PIPE, text=True, cwd=tmp_path))
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
    _check(series, [tmp_path / "out.0", tmp_path / "out.1"])


_LIGHTNING_PREEMPTED = textwrap.dedent("""
    import json, os, sys
    import lightning as L, torch
    from lightning.pytorch.callbacks import ModelCheckpoint
    from torchdata.stateful_dataloader import StatefulDataLoader
    import windowkit as wk

    store_path, out, ckpt_dir = sys.argv[1], sys.argv[2], sys.argv[3]
    kill_at, devices = int(sys.argv[4]), int(sys.argv[5])

    class Model(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(15, 6)

        def train_dataloader(self):
            ds = wk.open_store(store_path).torch_dataset("train", 16, seed=5)
            return StatefulDataLoader(ds, batch_size=None, sampler=ds.sampler())

        def training_step(self, batch, index):
            x, y = batch
            with open(f"{out}.{self.global_rank}", "a") as f:  # what this step trains
                f.write(json.dumps([self.current_epoch, self.global_step,
                                    x.flatten(1).numpy().tolist()]) + "\\n")
            return torch.nn.functional.mse_loss(self.layer(x.flatten(1)), y.flatten(1))

        def on_train_batch_start(self, batch, index):
            if self.global_step == kill_at:  # preempted: no clean shutdown
                os._exit(9)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    if __name__ == "__main__":
        last = os.path.join(ckpt_dir, "last.ckpt")
        trainer = L.Trainer(devices=devices, accelerator="cpu", strategy="ddp",
                            max_epochs=CHAOS_EPOCHS, logger=False, enable_progress_bar=False,
                            enable_model_summary=False,
                            callbacks=[ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=1,
                                                       save_top_k=0, save_last=True)])
        trainer.fit(Model(), ckpt_path=last if os.path.exists(last) else None)
""").replace("CHAOS_EPOCHS", "3")


def _steps_of(path: Path) -> list[Any]:
    """What each step a rank trained: [epoch, global step, the batch's rows]."""
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize("kills", [2, pytest.param(10, marks=pytest.mark.slow)])
def test_lightning_ddp_killed_and_resumed_trains_each_window_once_an_epoch(
        tmp_path: Path, kills: int) -> None:
    """Lightning ``Trainer(strategy="ddp")``, checkpointing every step, killed
    (no clean shutdown) at ``kills`` random steps across 3 epochs and run
    again from its last checkpoint (``ckpt_path``) each time: on 2 ranks,
    then on 1 from the middle kill on. The steps each run trained before the
    next one's checkpoint, together, train every window of each epoch once
    (a padded rank's repeats aside)."""
    store, series = _store(tmp_path)
    script = tmp_path / "fit.py"
    script.write_text(_LIGHTNING_PREEMPTED)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "MASTER_ADDR": "127.0.0.1"}
    at = sorted(np.random.default_rng(kills).choice(np.arange(1, 28), kills,
                                                    replace=False).tolist())
    runs = []
    for run, kill_at in enumerate([*at, -1]):
        devices = 2 if run <= kills // 2 else 1
        port = str(free_ports()[0])
        out = tmp_path / f"out{run}"
        proc = subprocess.run([sys.executable, str(script), str(store.path), str(out),
                               str(tmp_path / "ckpt"), str(kill_at), str(devices)],
                              env={**env, "MASTER_PORT": port},
                              capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert proc.returncode == (9 if kill_at >= 0 else 0), proc.stderr[-3000:]
        runs.append([step for rank in range(devices)
                     for step in _steps_of(Path(f"{out}.{rank}"))])
    trained = []
    for run, steps in enumerate(runs):  # what each run trained before the next one's start
        goes_on = min(s for _, s, _ in runs[run + 1]) if run + 1 < len(runs) else 1 << 30
        if run > 0:
            assert min(s for _, s, _ in steps) == at[run - 1]  # from the last checkpoint
        trained += [step for step in steps if step[1] < goes_on]
    x, _ = oracle_windows(series, SPEC)
    want = {tuple(np.round(row, 4)) for row in x.reshape(len(x), -1).tolist()}
    for epoch in range(3):
        rows = [tuple(np.round(row, 4)) for e, _, batch in trained if e == epoch
                for row in batch]
        assert set(rows) == want, f"windows missing from epoch {epoch}"
        assert len(rows) - len(want) <= 2 * (kills + 1), f"windows twice in epoch {epoch}"


_ACCELERATE_PREEMPTED = textwrap.dedent("""
    import json, os, sys
    from pathlib import Path
    import torch
    import windowkit as wk
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration

    store_path, out, ckpt, kill_at = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(
        use_stateful_dataloader=True))
    ds = wk.open_store(store_path).torch_dataset("train", 16, seed=5)
    loader = torch.utils.data.DataLoader(ds, batch_size=1, collate_fn=ds.collate)
    model = torch.nn.Linear(15, 6)
    model, optimizer, loader = accelerator.prepare(
        model, torch.optim.SGD(model.parameters(), lr=0.01), loader)
    epoch, step = 0, 0
    if (ckpt / "where.json").exists():  # preempted: the trainer's own checkpoint
        accelerator.load_state(str(ckpt))
        epoch, step = json.loads((ckpt / "where.json").read_text())
    else:
        ds.set_epoch(0)
    while epoch < EPOCHS:
        for x, y in loader:
            if step == kill_at:
                os._exit(9)
            loss = torch.nn.functional.mse_loss(model(x.flatten(1)), y.flatten(1))
            accelerator.backward(loss); optimizer.step(); optimizer.zero_grad()
            with open(f"{out}.{accelerator.process_index}", "a") as f:
                f.write(json.dumps([epoch, step, x.flatten(1).numpy().tolist()]) + "\\n")
            step += 1
            if step == SAVE:
                accelerator.save_state(str(ckpt))
                accelerator.wait_for_everyone()
                if accelerator.is_main_process:
                    (ckpt / "where.json").write_text(json.dumps([epoch, step]))
                accelerator.wait_for_everyone()
        epoch += 1
        ds.set_epoch(epoch)
""").replace("EPOCHS", str(EPOCHS)).replace("SAVE", "12")


def test_accelerate_save_state_resumes_mid_epoch(tmp_path: Path) -> None:
    """Accelerate's stateful loader saved with ``save_state`` at step 12 (inside
    epoch 1), killed two steps later, resumed with ``load_state``: per epoch,
    every window once between the ranks."""
    store, series = _store(tmp_path)
    script = tmp_path / "train.py"
    script.write_text(_ACCELERATE_PREEMPTED)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    for run, kill_at in enumerate((14, -1)):
        port = str(free_ports()[0])
        procs = []
        for rank in range(2):
            env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "RANK": str(rank),
                   "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
            procs.append(subprocess.Popen([sys.executable, str(script), str(store.path),
                                           f"{out}{run}", str(ckpt), str(kill_at)], env=env,
                                          stderr=subprocess.PIPE, text=True, cwd=tmp_path))
        for proc in procs:
            _, err = proc.communicate(timeout=300)
            assert proc.returncode == (9 if run == 0 else 0), err[-3000:]
    for rank in (0, 1):
        first = [json.loads(line) for line in Path(f"{out}0.{rank}").read_text().splitlines()]
        second = [json.loads(line) for line in Path(f"{out}1.{rank}").read_text().splitlines()]
        assert min(step for _, step, _ in second) == 12
        seen = [(e, b) for e, s, b in first if s < 12] + [(e, b) for e, _, b in second]
        assert sum(1 for e, _ in seen if e == 0) < 12  # the save is inside epoch 1
        Path(f"{out}.{rank}").write_text(json.dumps({"rank": rank, "seen": seen}))
    _check(series, [Path(f"{out}.0"), Path(f"{out}.1")])
