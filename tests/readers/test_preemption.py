"""Resuming after preemption, one regression test per way a resumed run used to
lose or double windows silently.

Every window is told apart by its first value (``numbered_series``), so a
batch is a list of window ids; an epoch's ids are compared with the
uninterrupted run's, batch for batch where nothing about the reader changed,
as a multiset where the machine did (another memory budget).
"""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given
from hypothesis import strategies as st

import windowkit as wk
import windowkit.readers.epoch.shares as wk_shares
from tests.helpers import numbered_series
from tests.readers.chaos_train import ids
from windowkit.errors import InvalidSpecError, carried_error

torch = pytest.importorskip("torch")
from torchdata.stateful_dataloader import StatefulDataLoader  # noqa: E402

SPEC = wk.WindowSpec(6, stride=1)
LENGTHS = [900, 700, 450, 260]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> wk.Store:
    path = tmp_path_factory.mktemp("preempt") / "store"
    return wk.convert(numbered_series(LENGTHS, features=2), path, format="zarr",
                      window=SPEC, block_rows=32)


def epoch_batches(store: wk.Store, epoch: int, **options: Any) -> list[list[int]]:
    """Epoch ``epoch`` of an uninterrupted Keras-order reader, batch by batch."""
    ds = store.keras_dataset("train", 16, seed=3, **options)
    return [ids(ds.batches.batch_at(epoch, i)) for i in range(ds.batches.batches_in(epoch))]


# -- Keras fit after seek/resume trains the rest of that epoch, then whole epochs --------------
class Recording(keras.Model):
    """A model whose training steps record the windows they were given."""

    def __init__(self) -> None:
        super().__init__()
        self.dense = keras.layers.Dense(1)
        self.seen: list[list[int]] = []

    def call(self, x: Any) -> Any:
        return self.dense(keras.ops.reshape(x, (-1, SPEC.length * 2)))

    def train_step(self, data: Any) -> dict[str, Any]:
        self.seen.append(ids(data))
        return {"loss": keras.ops.convert_to_tensor(0.0)}


def fit_windows(ds: Any, epochs: int, callbacks: list[Any] | None = None) -> list[list[int]]:
    model = Recording()
    model.compile("sgd", "mse", run_eagerly=True)
    model.fit(ds, epochs=epochs, verbose=0, shuffle=False, callbacks=callbacks or [])
    return model.seen


def test_keras_fit_trains_epoch_0_first(store: wk.Store) -> None:
    seen = fit_windows(store.keras_dataset("train", 16, seed=3), epochs=2)
    assert seen == epoch_batches(store, 0) + epoch_batches(store, 1)


@pytest.mark.parametrize("how", ["seek", "resume"])
def test_keras_fit_after_a_resume_trains_the_rest_of_that_epoch_then_whole_ones(
        store: wk.Store, how: str) -> None:
    ds = store.keras_dataset("train", 16, seed=3)
    if how == "seek":
        ds.seek(1, 5)
    else:
        ds.resume(json.loads(json.dumps(store.keras_dataset("train", 16, seed=3)
                                        .batches.position_after(1, 5))))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        seen = fit_windows(ds, epochs=2)
    assert seen == epoch_batches(store, 1)[5:] + epoch_batches(store, 2)
    assert not [w for w in caught if "ran out of data" in str(w.message)]  # by design


# -- another memory budget: the saved order goes on -------------------------------------------
BUDGETS = (6_000, 24_000)  # bytes: block groups of different sizes, both below the split


def test_the_budgets_here_choose_different_orders(store: wk.Store) -> None:
    orders = {store.keras_dataset("train", 16, memory_budget=b).batches.epoch_order
              for b in BUDGETS}
    assert len(orders) == 2 and all(o.startswith("blocks:") for o in orders), orders


def test_a_position_resumed_under_another_budget_goes_on_in_the_saved_order(
        store: wk.Store) -> None:
    saved = store.keras_dataset("train", 16, seed=3, memory_budget=BUDGETS[0])
    whole = [ids(saved.batches.batch_at(1, i)) for i in range(saved.batches.batches_in(1))]
    saved.seek(1, 7)
    position = json.loads(json.dumps(saved.position_after(7)))
    other = store.keras_dataset("train", 16, seed=3, memory_budget=BUDGETS[1])
    other.resume(position)
    assert other.batches.epoch_order == saved.batches.epoch_order
    rest = [ids(other[i]) for i in range(len(other))]
    assert rest == whole[7:]  # batch for batch: the order travelled with the position
    other.on_epoch_end()
    assert [ids(other[i]) for i in range(len(other))] == [
        ids(saved.batches.batch_at(2, i)) for i in range(saved.batches.batches_in(2))]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_torch_state_loaded_under_another_budget_goes_on_in_the_saved_order(
        store: wk.Store, workers: int) -> None:
    def loader(budget: int) -> Any:
        ds = store.torch_dataset("train", 16, seed=3, memory_budget=budget)
        return StatefulDataLoader(ds, batch_size=None, num_workers=workers,
                                  sampler=ds.sampler())

    first = loader(BUDGETS[0])
    whole = [ids(b) for b in first]  # epoch 0, then the loader reads epoch 1
    it = iter(first)
    done = [ids(next(it)) for _ in range(6)]
    state = first.state_dict()
    del it
    second = loader(BUDGETS[1])
    second.load_state_dict(state)
    rest = [ids(b) for b in second]
    assert whole == _epoch_of(store, 0, BUDGETS[0])
    assert done + rest == _epoch_of(store, 1, BUDGETS[0])  # batch for batch


def _epoch_of(store: wk.Store, epoch: int, budget: int) -> list[list[int]]:
    ds = store.torch_dataset("train", 16, seed=3, memory_budget=budget)
    return [ids(ds.batches.batch_at(epoch, i)) for i in range(ds.batches.batches_in(epoch))]


# -- a torch state inside an epoch that was itself resumed ------------------------------------
@pytest.mark.parametrize("workers", [0, 2])
def test_a_torch_state_inside_a_resumed_epoch_keeps_the_resume(store: wk.Store,
                                                                 workers: int) -> None:
    two = [store.torch_dataset("train", 16, seed=3, rank=r, world_size=2) for r in (0, 1)]
    position = two[0].position_after(4)  # both ranks read 4 batches of epoch 0
    read_before = {w for ds in two for i in range(4) for w in ids(ds.batches.batch_at(0, i))}

    ds = store.torch_dataset("train", 16, seed=3)
    ds.resume(position)
    resumed = StatefulDataLoader(ds, batch_size=None, num_workers=workers, sampler=ds.sampler())
    it = iter(resumed)
    done = [w for _ in range(3) for w in ids(next(it))]
    state = json.loads(json.dumps(resumed.state_dict(), default=int))
    del it
    fresh = store.torch_dataset("train", 16, seed=3)  # a new process's dataset
    again = StatefulDataLoader(fresh, batch_size=None, num_workers=workers,
                               sampler=fresh.sampler())
    again.load_state_dict(state)
    rest = [w for b in again for w in ids(b)]
    epoch = sorted(read_before) + sorted(done + rest)
    assert sorted(epoch) == sorted(w for b in _epoch_of(store, 0, 1 << 30) for w in b)
    assert len(set(done + rest)) == len(done + rest)  # nothing twice


# -- a tf.train.Checkpoint behind transforms ----------------------------------------------------
def _pipeline(store: wk.Store, seed: int) -> Any:
    ds = store.tf_dataset("train", 16, seed=seed)
    ds.set_epoch(2)
    return ds, ds.map(lambda x: x * 1).prefetch(2).take(1000)


def test_a_tf_checkpoint_behind_transforms_restores_its_epoch_exactly(
        store: wk.Store, tmp_path: Path) -> None:
    _, piped = _pipeline(store, 3)
    it = iter(piped)
    done = [ids(next(it)) for _ in range(5)]
    path = tf.train.Checkpoint(iterator=it).write(str(tmp_path / "ckpt"))
    rest = [ids(b) for b in it]
    assert done + rest == epoch_batches(store, 2)[:len(done + rest)]
    fresh = store.tf_dataset("train", 16, seed=3)  # a new process: its epoch counter at 0
    again = iter(fresh.map(lambda x: x * 1).prefetch(2).take(1000))
    tf.train.Checkpoint(iterator=again).read(path)
    assert [ids(b) for b in again] == rest


def test_a_tf_checkpoint_behind_transforms_into_another_seed_is_one_line(
        store: wk.Store, tmp_path: Path) -> None:
    _, piped = _pipeline(store, 1)
    it = iter(piped)
    next(it)
    path = tf.train.Checkpoint(iterator=it).write(str(tmp_path / "ckpt"))
    _, other = _pipeline(store, 2)
    again = iter(other)
    with pytest.raises(Exception) as caught:
        tf.train.Checkpoint(iterator=again).read(path)
        next(again)
    error = carried_error(caught.value)
    assert isinstance(error, InvalidSpecError), str(caught.value)[-500:]
    assert "\n" not in str(error) and "built otherwise" in str(error)


# -- Lightning saves rank 0's loader state for every rank ---------------------------------------
def test_rank_0s_torch_state_resumes_every_rank_exactly(store: wk.Store) -> None:
    def loader(rank: int) -> Any:
        ds = store.torch_dataset("train", 16, seed=3, rank=rank, world_size=2)
        return StatefulDataLoader(ds, batch_size=None, sampler=ds.sampler())

    whole = {r: [ids(b) for b in loader(r)] for r in (0, 1)}
    rank0 = loader(0)
    it = iter(rank0)
    for _ in range(5):
        next(it)
    state = rank0.state_dict()
    for rank in (0, 1):
        resumed = loader(rank)
        resumed.load_state_dict(state)
        assert [ids(b) for b in resumed] == whole[rank][5:]


def _loaders(store: wk.Store, ranks: int, workers: int = 0, **options: Any) -> list[Any]:
    datasets = [store.torch_dataset("train", 16, seed=3, rank=r, world_size=ranks, **options)
                for r in range(ranks)]
    return [StatefulDataLoader(ds, batch_size=None, num_workers=workers, sampler=ds.sampler())
            for ds in datasets]


def _steps(loaders: list[Any], count: int | None = None) -> list[list[int]]:
    """``count`` steps (all that are left by default) of ranks stepping together:
    every window each step trains, on every rank."""
    iterators = [iter(loader) for loader in loaders]
    steps: list[list[int]] = []
    while count is None or len(steps) < count:
        try:
            steps.append([w for it in iterators for w in ids(next(it))])
        except StopIteration:
            break
    return steps


@pytest.mark.parametrize(("before", "after", "workers"), [(2, 1, 0), (2, 3, 2), (1, 4, 0)])
def test_a_torch_state_resumes_on_another_number_of_ranks(
        store: wk.Store, before: int, after: int, workers: int) -> None:
    """Saved (rank 0's state, as Lightning saves it) 5 steps into epoch 0 on
    ``before`` ranks, resumed on ``after``, saved again 2 steps on and resumed
    on ``before``: epoch 0 trains every window once (a padded rank's repeats
    aside), the trainer's count goes on from 5, and epoch 1 is whole."""
    every = sorted(w for batch in _epoch_of(store, 0, 1 << 30) for w in batch)
    first = _loaders(store, before, workers)
    seen = [w for step in _steps(first, 5) for w in step]
    state = json.loads(json.dumps(first[0].state_dict(), default=int))
    second = _loaders(store, after, workers)
    for loader in second:
        loader.load_state_dict(state)
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        seen += [w for step in _steps(second, 2) for w in step]
    assert any("ends it early" in str(w.message) for w in warned) == (after > before)
    counted = len(second[0])  # the trainer's count: 5 steps before, those left after
    state = second[0].state_dict()
    third = _loaders(store, before, workers)
    for loader in third:
        loader.load_state_dict(state)
    rest = _steps(third)
    seen += [w for step in rest for w in step]
    assert counted >= 7 and len(third[0]) == 7 + len(rest)
    assert set(seen) == set(every)
    assert len(seen) - len(set(seen)) <= 2 * (before + after)  # padding repeats, no more
    next_epoch = _steps(third)
    assert sorted({w for step in next_epoch for w in step}) == every


def test_a_torch_state_of_other_ranks_without_the_sampler_is_one_line(store: wk.Store) -> None:
    state = _loaders(store, 2)[0].state_dict()
    ds = store.torch_dataset("train", 16, seed=3)
    loader = StatefulDataLoader(ds, batch_size=None)  # no sampler: nobody says how far
    loader.load_state_dict(state)
    with pytest.raises(InvalidSpecError, match=r"sampler=dataset\.sampler\(\)"):
        next(iter(loader))


# -- Grain iterator states ----------------------------------------------------------------------
def _grain_iterator(store: wk.Store, **options: Any) -> Any:
    src = store.grain_batches("train", 16, **{"seed": 3, "epochs": 2, **options})
    return iter(src.iter_dataset().map(lambda x: x * 1))


def test_a_grain_state_goes_on_in_its_order_under_another_budget(store: wk.Store) -> None:
    it = _grain_iterator(store, memory_budget=BUDGETS[0])
    for _ in range(5):
        next(it)
    state = json.loads(json.dumps(it.get_state()))
    rest = [ids(b) for b in it]
    again = _grain_iterator(store, memory_budget=BUDGETS[1])  # another machine's order
    again.set_state(state)
    assert [ids(b) for b in again] == rest


@pytest.mark.parametrize(("change", "key"), [({"seed": 4}, "seed"),
                                             ({"shuffle": False}, "shuffle"),
                                             ({"epochs": 3}, "epochs")])
def test_a_grain_state_restored_into_another_source_is_one_line(
        store: wk.Store, change: dict[str, Any], key: str) -> None:
    it = _grain_iterator(store)
    next(it)
    state = it.get_state()
    with pytest.raises(InvalidSpecError, match=f"is for {key}=") as caught:
        _grain_iterator(store, **change).set_state(state)
    assert "\n" not in str(caught.value)
    with pytest.raises(InvalidSpecError, match="not a state of a windowkit Grain iterator"):
        _grain_iterator(store).set_state(state["grain"])  # Grain's part alone: unchecked


# -- tampered positions -------------------------------------------------------------------------
@pytest.mark.parametrize("change", [
    {"stops": [[10**9, 5]]}, {"stops": [[2, 10**12]]}, {"stops": [[1, 1]] * 5000},
    {"stops": [["2", 1]]}, {"stops": [[True, 1]]}, {"stops": "x"}, {"epoch": 2**64},
    {"epoch": -1}, {"epoch": 1.5}, {"order": "blocks:0"}, {"order": "random"},
])
def test_a_tampered_position_is_one_line_within_a_second(store: wk.Store,
                                                          change: dict[str, Any]) -> None:
    ds = store.keras_dataset("train", 16, seed=3)
    position = {**ds.position_after(2), **change}
    began = time.monotonic()
    with pytest.raises(InvalidSpecError) as caught:
        store.keras_dataset("train", 16, seed=3).resume(position)
    assert time.monotonic() - began < 1.0
    assert "\n" not in str(caught.value)
    with pytest.raises(InvalidSpecError):
        store.torch_dataset("train", 16, seed=3).load_state_dict(
            {**store.torch_dataset("train", 16, seed=3).state_dict(), **change,
             "stops": change.get("stops", [[1, 16]])})


def test_a_distribution_strategys_iterator_is_refused_and_set_epoch_with_skip_is_exact(
        store: wk.Store) -> None:
    """TensorFlow refuses to checkpoint a distributed iterator (one line, at
    ``Checkpoint``): nothing is restored silently. The way the docs give
    instead, the epoch and the steps done saved with the model, then
    ``set_epoch`` and ``skip``, goes on exactly."""
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    ds = store.tf_dataset("train", 16, seed=3)
    ds.set_epoch(2)
    it = iter(strategy.experimental_distribute_dataset(ds.map(lambda x: x * 1)))
    with pytest.raises(ValueError, match="trackable") as caught:
        tf.train.Checkpoint(iterator=it)
    assert "\n" not in str(caught.value)
    fresh = store.tf_dataset("train", 16, seed=3)  # a new process: epoch and steps saved
    fresh.set_epoch(2)
    again = strategy.experimental_distribute_dataset(fresh.skip(5).map(lambda x: x * 1))
    assert [ids(b) for b in again] == epoch_batches(store, 2)[5:]


def test_a_tf_checkpoint_restores_exactly_behind_repeat(store: wk.Store,
                                                         tmp_path: Path) -> None:
    def iterator() -> Any:
        ds = store.tf_dataset("train", 16, seed=3)
        ds.set_epoch(1)
        return iter(ds.repeat().map(lambda x: x * 1).prefetch(2))

    per_epoch = len(epoch_batches(store, 1))
    it = iterator()
    for _ in range(per_epoch - 3):  # into the last batches of epoch 1
        next(it)
    path = tf.train.Checkpoint(iterator=it).write(str(tmp_path / "ckpt"))
    again = iterator()
    tf.train.Checkpoint(iterator=again).read(path)
    rest = [ids(next(again)) for _ in range(5)]
    assert rest == epoch_batches(store, 1)[-3:] + epoch_batches(store, 2)[:2]


def _left_by_loop(order: np.ndarray, stops: list[tuple[int, int]]) -> np.ndarray:
    """The windows an epoch has left, shard by shard in Python (the oracle)."""
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    left = np.arange(len(order))
    for shards, read in stops:
        kept: list[int] = []
        for index in range(shards):
            piece = wk_shares.ShardShare(index, shards, len(left))
            mine = sorted(left[piece.lo:piece.hi], key=lambda w: rank[w])
            kept += mine[read:]
        left = np.array(sorted(kept), dtype=np.int64)
    return left


@given(total=st.integers(1, 300), seed=st.integers(0, 2**32 - 1),
       stops=st.lists(st.tuples(st.integers(1, 12), st.integers(0, 40)), max_size=4))
def test_windows_left_equals_a_shard_by_shard_loop(total: int, seed: int,
                                                   stops: list[tuple[int, int]]) -> None:
    order = np.random.default_rng(seed).permutation(total)
    got = wk_shares.windows_left(lambda where: order[where], total,
                                 [wk_shares.EpochStop(*stop) for stop in stops])
    np.testing.assert_array_equal(got, _left_by_loop(order, stops))
