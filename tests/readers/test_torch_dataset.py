"""``Store.torch_dataset``: a map-style PyTorch ``Dataset`` of whole batches, per format.

An epoch through ``DataLoader(ds, batch_size=None)`` must hold exactly the
NumPy oracle's windows, each once, with 0 and 2 workers (``fork`` and
``spawn``), the same batches in the same order whatever the workers; ranks are
disjoint and cover the split; ``StatefulDataLoader`` resumes mid-epoch with the
batches an uninterrupted run yields.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import ConcatDataset, DataLoader, DistributedSampler  # noqa: E402

import windowkit as wk  # noqa: E402
from tests.conftest import assert_windows_equal, oracle_windows, window_keys  # noqa: E402
from tests.helpers import numbered_series, random_series  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
LENGTHS = [500, 320, 7, 260]  # one series too short for a window
SPEC = wk.WindowSpec(5, stride=2, horizon=2)
Epoch = tuple[np.ndarray, np.ndarray | None]


@pytest.fixture
def series() -> list[np.ndarray]:
    return numbered_series(LENGTHS, features=3)


@pytest.fixture
def store(tmp_path: Path, fmt: str, series: list[np.ndarray]) -> wk.Store:
    return wk.convert(series, tmp_path / fmt, format=fmt, window=SPEC, block_rows=64)


def _xy(batch: Any) -> tuple[np.ndarray, np.ndarray]:
    x, y = batch
    assert isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)
    return x.numpy(), y.numpy()


def _epoch(batches: Any) -> Epoch:
    pairs = [_xy(b) for b in batches]
    return np.concatenate([p[0] for p in pairs]), np.concatenate([p[1] for p in pairs])


def _loader(ds: Any, workers: int = 0, context: str | None = None, **options: Any) -> Any:
    return DataLoader(ds, batch_size=None, num_workers=workers,
                      multiprocessing_context=context if workers else None, **options)


@pytest.mark.parametrize("shuffle", [True, "blocks", "global", False])
def test_an_epoch_is_the_oracle(store: wk.Store, series: list[np.ndarray],
                                shuffle: bool | str) -> None:
    ds = store.torch_dataset("train", 32, shuffle=shuffle, seed=3)
    x, y = _epoch(_loader(ds))
    want_x, want_y = oracle_windows(series, SPEC)
    assert_windows_equal(x, y, want_x, want_y, in_order=shuffle is False)
    assert x.dtype == series[0].dtype and len(ds) == -(-len(want_x) // 32)


def test_two_forked_workers_yield_the_same_batches(store: wk.Store) -> None:
    ds = store.torch_dataset("train", 32, seed=1)
    ds.set_epoch(2)
    alone = [_xy(b) for b in _loader(ds)]
    ds.set_epoch(2)
    forked = [_xy(b) for b in _loader(ds, 2, "fork")]
    assert len(alone) == len(forked) == len(ds)
    for (ax, ay), (fx, fy) in zip(alone, forked, strict=True):
        np.testing.assert_array_equal(ax, fx)
        np.testing.assert_array_equal(ay, fy)


def test_spawned_workers_read_every_format(tmp_path: Path, series: list[np.ndarray]) -> None:
    """One spawned, persistent pool for the three formats (a ``ConcatDataset``):
    workers open the stores from their pickled plans, yield the in-process
    batches, and follow ``set_epoch``."""
    sets = [wk.convert(series, tmp_path / fmt, format=fmt, window=SPEC, block_rows=64)
            .torch_dataset("train", 32, seed=4) for fmt in wk.FORMAT_NAMES]
    loader = _loader(ConcatDataset(sets), 2, "spawn", persistent_workers=True)
    for epoch in (0, 1):
        for ds in sets:
            ds.set_epoch(epoch)
        alone = [_xy(b) for ds in sets for b in _loader(ds)]
        for ds in sets:
            ds.set_epoch(epoch)
        spawned = [_xy(b) for b in loader]
        assert len(spawned) == len(alone)
        for (ax, ay), (sx, sy) in zip(alone, spawned, strict=True):
            np.testing.assert_array_equal(ax, sx)
            np.testing.assert_array_equal(ay, sy)


def test_set_epoch_reaches_persistent_workers(store: wk.Store) -> None:
    ds = store.torch_dataset("train", 32, seed=2)
    loader = _loader(ds, 2, "fork", persistent_workers=True)
    epochs = []
    for epoch in range(3):
        ds.set_epoch(epoch)
        epochs.append(_epoch(loader))
    in_process = []
    for epoch in range(3):
        ds.set_epoch(epoch)
        in_process.append(_epoch(_loader(ds)))
    for (x, y), (ix, iy) in zip(epochs, in_process, strict=True):
        np.testing.assert_array_equal(x, ix)
        np.testing.assert_array_equal(y, iy)
    assert not np.array_equal(epochs[0][0], epochs[1][0])  # each epoch its own order
    assert sorted(window_keys(*epochs[0])) == sorted(window_keys(*epochs[1]))


@pytest.mark.parametrize("shuffle", [True, "blocks"])
def test_ranks_are_disjoint_balanced_and_cover_the_split(store: wk.Store,
                                                         series: list[np.ndarray],
                                                         shuffle: bool | str) -> None:
    ranks = [store.torch_dataset("train", 16, shuffle=shuffle, rank=r, world_size=2)
             for r in range(2)]
    assert len(ranks[0]) == len(ranks[1])  # every rank steps together
    epochs = [_epoch(_loader(ds, sampler=ds.sampler())) for ds in ranks]
    # a plain DistributedSampler that keeps the order splits the same way
    plain = [_epoch(_loader(ds, sampler=DistributedSampler(ds, 2, r, shuffle=False)))
             for r, ds in enumerate(ranks)]
    assert [sorted(window_keys(*e)) for e in plain] == [sorted(window_keys(*e)) for e in epochs]
    keys = [set(window_keys(*e)) for e in epochs]
    want = set(window_keys(*oracle_windows(series, SPEC)))
    assert not keys[0] & keys[1] and keys[0] | keys[1] == want
    # each rank's epoch is its own shard, padded with its own last window to the larger share
    assert len(epochs[0][0]) == len(epochs[1][0]) == max(len(k) for k in keys)
    assert max(len(k) for k in keys) - min(len(k) for k in keys) <= 1


def test_a_loader_not_split_by_rank_is_one_line(store: wk.Store) -> None:
    """Every rank reading every item (no sampler, or a shuffling one) stops at
    the first item of another rank, naming the sampler to pass."""
    ds = store.torch_dataset("train", 16, rank=0, world_size=2)
    with pytest.raises(wk.InvalidSpecError, match=r"not split by rank.*dataset\.sampler\(\)"):
        list(_loader(ds))
    with pytest.raises(wk.InvalidSpecError, match="a batch of rank 1"):
        ds[1]


def test_a_rank_reads_only_its_own_blocks(store: wk.Store) -> None:
    plan = store.torch_dataset("train", 16, rank=1, world_size=2).batches.plan
    whole = store.read_plan("train")
    mine = np.flatnonzero(plan.windows_per_block())
    assert plan.shard == (1, 2) and 0 < len(mine) < np.count_nonzero(whole.windows_per_block())


def test_rank_arguments_are_checked(store: wk.Store) -> None:
    with pytest.raises(wk.InvalidSpecError, match="go together"):
        store.torch_dataset("train", rank=0)
    with pytest.raises(wk.InvalidSpecError, match=r"rank must be in 0\.\.1"):
        store.torch_dataset("train", rank=2, world_size=2)


def test_resume_with_stateful_dataloader(store: wk.Store) -> None:
    """Stopped 3 batches into epoch 1 (with 0 and with 2 workers), a new loader
    restored from ``state_dict()`` yields exactly the rest of epoch 1."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    for workers in (0, 2):
        ds = store.torch_dataset("train", 16, seed=7)
        ds.set_epoch(1)
        whole = [_xy(b) for b in _loader(ds)]
        ds.set_epoch(1)
        first = StatefulDataLoader(ds, batch_size=None, num_workers=workers)
        it = iter(first)
        for _ in range(3):
            next(it)
        state = first.state_dict()
        del it, first
        resumed_ds = store.torch_dataset("train", 16, seed=7)  # a new process's dataset
        second = StatefulDataLoader(resumed_ds, batch_size=None, num_workers=workers)
        second.load_state_dict(state)
        rest = [_xy(b) for b in second]
        assert resumed_ds.epoch == 1 and len(rest) == len(whole) - 3
        for (wx, wy), (rx, ry) in zip(whole[3:], rest, strict=True):
            np.testing.assert_array_equal(wx, rx)
            np.testing.assert_array_equal(wy, ry)


def test_dict_batches_and_normalized_tensors(tmp_path: Path, fmt: str) -> None:
    store = wk.convert(random_series([300, 200], features=3), tmp_path / "s", format=fmt,
                       window=SPEC, block_rows=64)
    ds = store.torch_dataset("train", 32, normalize=True, return_series=True, shuffle=False)
    x, y = ds[0]
    assert set(x) == {"inputs", "series"} and x["series"].dtype == torch.int32
    assert x["inputs"].dtype == torch.float32 and tuple(x["inputs"].shape) == (32, 5, 3)
    want = store.windows("train", np.arange(32), normalize=True, return_series=True)
    np.testing.assert_allclose(x["inputs"].numpy(), want[0]["inputs"])
    np.testing.assert_allclose(y.numpy(), want[1])


def test_pickles_as_plan_and_arguments(store: wk.Store) -> None:
    ds = store.torch_dataset("train", 32, seed=1)
    ds.set_epoch(3)
    data = pickle.dumps(ds)
    assert len(data) < 20_000  # no rows, no blocks
    again = pickle.loads(data)
    assert again.epoch == 3
    np.testing.assert_array_equal(_xy(again[1])[0], _xy(ds[1])[0])


def test_a_torch_model_learns(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    t = np.arange(2000, dtype=np.float32)
    series = [np.stack([np.sin(t / p + rng.uniform(0, 6)) for p in (5, 9)], axis=1)
              for _ in range(3)]
    store = wk.convert(series, tmp_path / "s", format="zarr",
                       window=wk.WindowSpec(16, horizon=1), block_rows=256)
    ds = store.torch_dataset("train", 64)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(32, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for epoch in range(3):
        ds.set_epoch(epoch)
        total = 0.0
        for x, y in _loader(ds):
            loss = torch.nn.functional.mse_loss(model(x), y[:, 0])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item()
        losses.append(total / len(ds))
    assert losses[-1] < 0.2 * losses[0]


_DDP = textwrap.dedent("""
    import json, os, sys
    import numpy as np, torch, torch.distributed as dist
    import windowkit as wk
    from torch.nn.parallel import DistributedDataParallel

    store_path, init, rank, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    ds = wk.open_store(store_path).torch_dataset("train", 16, seed=5)  # rank from dist
    sampler = torch.utils.data.DistributedSampler(ds, shuffle=False)  # the usual DDP idiom
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=1, sampler=sampler)
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Flatten(),
                                                        torch.nn.Linear(15, 6)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    keys, steps = [[], []], 0
    for epoch in range(2):
        sampler.set_epoch(epoch)  # reaches the sampler only: each pass is a new epoch anyway
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y.flatten(1))
            optimizer.zero_grad(); loss.backward(); optimizer.step()
            steps += 1
            keys[epoch] += [row.tobytes().hex() for row in x.flatten(1).numpy()]
    weights = [p.detach().numpy().ravel().tolist() for p in model.parameters()]
    json.dump({"rank": ds.rank, "world": ds.world_size, "keys": keys, "steps": steps,
               "weights": weights}, open(out, "w"))
    dist.destroy_process_group()
""")


def test_distributed_data_parallel_on_two_gloo_ranks(tmp_path: Path) -> None:
    """Two processes, ``torch.distributed`` (gloo, CPU) and DDP: the ranks come
    from the process group, step together, read disjoint windows that cover
    the split, and end with the same weights."""
    series = [s.astype(np.float32) for s in numbered_series(LENGTHS, features=3)]
    store = wk.convert(series, tmp_path / "s", format="parquet", window=SPEC, block_rows=64)
    script = tmp_path / "ddp.py"
    script.write_text(_DDP)
    init = f"file://{tmp_path / 'rendezvous'}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, str(script), str(store.path), init, str(r),
                               str(tmp_path / f"rank{r}.json")], env=env,
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    for proc in procs:
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [(r["rank"], r["world"]) for r in ranks] == [(0, 2), (1, 2)]
    assert ranks[0]["steps"] == ranks[1]["steps"] > 0
    np.testing.assert_allclose(np.concatenate([np.asarray(w) for w in ranks[0]["weights"]]),
                               np.concatenate([np.asarray(w) for w in ranks[1]["weights"]]))
    x, _ = oracle_windows(series, SPEC)
    want = {row.tobytes().hex() for row in x.reshape(len(x), -1)}
    for epoch in range(2):
        keys = [set(r["keys"][epoch]) for r in ranks]
        assert not keys[0] & keys[1] and keys[0] | keys[1] == want
        assert max(len(r["keys"][epoch]) - len(set(r["keys"][epoch])) for r in ranks) <= 1
    assert ranks[0]["keys"][0] != ranks[0]["keys"][1]  # a new order each epoch


def test_the_dataset_classes_keep_their_old_import_paths() -> None:
    """``windowkit.readers.keras`` and ``.torch`` hold the Store's methods and
    import no framework; the classes they return, moved beside them, still
    import from there."""
    import windowkit.readers.keras as keras_reader
    import windowkit.readers.torch as torch_reader
    from windowkit.readers.keras_pydataset import WindowPyDataset
    from windowkit.readers.torch_dataset import WindowSampler, WindowTorchDataset

    assert keras_reader.WindowPyDataset is WindowPyDataset
    assert torch_reader.WindowTorchDataset is WindowTorchDataset
    assert torch_reader.WindowSampler is WindowSampler
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        _ = torch_reader.nothing
