"""A saved position carries what its reader was built for (store, split, seed,
shuffle, epoch order, batch size, shards and shard): restored into a reader
built otherwise, every reader says so in one line, before any window is lost
or read twice: a torch dataset's ``state_dict`` (and so ``StatefulDataLoader``),
a ``tf.data`` iterator's ``tf.train.Checkpoint``, Keras ``backup_and_restore``
and ``position_after``/``resume`` (which alone resumes on another number of
shards, or with another batch size: it counts windows). A torch state goes
to any rank (ranks step together; Lightning saves one rank's); a ``tf.data``
checkpoint goes to any reader of the same order, whichever ``shuffle``
option chose it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

import windowkit as wk
from windowkit.errors import InvalidSpecError, carried_error

SPEC = wk.WindowSpec(8, horizon=1)


def _convert(path: Path, scale: float = 1.0) -> wk.Store:
    rng = np.random.default_rng(4)
    arrays = [(rng.normal(size=(n, 3)) * scale).astype(np.float32) for n in (400, 300)]
    return wk.convert(arrays, path, format="zarr", window=SPEC, block_rows=64,
                      splits="train=0.8,val=0.2")


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> tuple[wk.Store, wk.Store]:
    root = tmp_path_factory.mktemp("saved")
    return _convert(root / "a"), _convert(root / "b", scale=2.0)


BASE: dict[str, Any] = {"split": "train", "batch_size": 16, "seed": 1, "shuffle": True}
TWO_RANKS = {"world_size": 2, "rank": 0}
#: The reader saved, one built otherwise, and the key the line names
OTHERWISE = [({}, {"seed": 2}, "seed"), ({}, {"batch_size": 32}, "batch_size"),
             ({}, {"split": "val"}, "split"), ({}, {"store": "b"}, "store_id"),
             ({}, {"shuffle": "global"}, "shuffle"), ({}, {"shuffle": False}, "shuffle"),
             ({}, TWO_RANKS, "num_shards"), (TWO_RANKS, {**TWO_RANKS, "rank": 1}, "shard")]
IDS = [key if key != "shuffle" else f"shuffle={options['shuffle']}"
       for _, options, key in OTHERWISE]
#: a torch state goes to any rank, and regroups on another rank count
#: (test_preemption.py)
TORCH_OTHERWISE = [case for case in OTHERWISE if case[2] not in ("shard", "num_shards")]
#: a tf.data checkpoint names the order itself: shuffle=False is another order,
#: shuffle="global" the same uniform one as shuffle=True where the rows fit
TF_OTHERWISE = [(built, change, "order" if key == "shuffle" else key)
                for built, change, key in OTHERWISE if change.get("shuffle") != "global"]


def _options(stores: tuple[wk.Store, wk.Store], change: dict[str, Any]
             ) -> tuple[wk.Store, dict[str, Any]]:
    options = {**BASE, **change}
    store = stores[1] if options.pop("store", "a") == "b" else stores[0]
    return store, options


def _one_line(call: Callable[[], Any], key: str) -> str:
    with pytest.raises(Exception) as caught:
        call()
    error = carried_error(caught.value) or caught.value
    assert isinstance(error, InvalidSpecError), repr(caught.value)[:2000]
    assert "\n" not in str(error) and f"is for {key}=" in str(error), str(error)
    return str(error)


# -- torch -------------------------------------------------------------------------------------
def _torch(stores: tuple[wk.Store, wk.Store], change: dict[str, Any]) -> Any:
    store, options = _options(stores, change)
    split, batch_size = options.pop("split"), options.pop("batch_size")
    options.setdefault("world_size", 1)
    options.setdefault("rank", 0)
    return store.torch_dataset(split, batch_size, **options)


@pytest.mark.parametrize(("built", "change", "key"), TORCH_OTHERWISE,
                         ids=[case[2] if case[2] != "shuffle" else f"shuffle={case[1]['shuffle']}"
                              for case in TORCH_OTHERWISE])
def test_a_torch_state_restored_into_another_reader_is_one_line(
        stores: tuple[wk.Store, wk.Store], built: dict[str, Any], change: dict[str, Any],
        key: str) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    def loader(change: dict[str, Any]) -> Any:
        ds = _torch(stores, change)
        return StatefulDataLoader(ds, batch_size=None, sampler=ds.sampler())

    saved = loader(built)
    it = iter(saved)
    next(it), next(it)
    state = json.loads(json.dumps(saved.state_dict(), default=int))
    other = loader(change)
    _one_line(lambda: (other.load_state_dict(state), next(iter(other))), key)
    same = loader(built)
    same.load_state_dict(state)  # the reader it was saved for goes on
    assert next(iter(same)) is not None


def test_a_torch_state_that_is_not_one_is_one_line(stores: tuple[wk.Store, wk.Store]) -> None:
    ds = _torch(stores, {})
    for state in ({}, {"epoch": 1}, [1, 2]):
        with pytest.raises(InvalidSpecError) as caught:
            ds.load_state_dict(state)  # type: ignore[arg-type]
        assert "\n" not in str(caught.value)
    with pytest.raises(InvalidSpecError, match="epoch must be below"):
        ds.set_epoch(2**63)


# -- tf.data -------------------------------------------------------------------------------------
def _tf(stores: tuple[wk.Store, wk.Store], change: dict[str, Any]) -> tf.data.Dataset:
    store, options = _options(stores, change)
    split, batch_size = options.pop("split"), options.pop("batch_size")
    if "world_size" in options:
        shards = {"num_shards": options.pop("world_size"), "shard_index": options.pop("rank")}
        options.update(shards)
    return store.tf_dataset(split, batch_size, **options)


@pytest.mark.parametrize(("built", "change", "key"), TF_OTHERWISE,
                         ids=[f"{case[2]}-{'-'.join(map(str, case[1].values()))}"
                              for case in TF_OTHERWISE])
def test_a_tf_checkpoint_restored_into_another_reader_is_one_line(
        stores: tuple[wk.Store, wk.Store], tmp_path: Path, built: dict[str, Any],
        change: dict[str, Any], key: str) -> None:
    iterator = iter(_tf(stores, built))
    next(iterator), next(iterator)
    path = tf.train.Checkpoint(iterator=iterator).write(str(tmp_path / "ckpt"))
    rest = [x.numpy() for x, _ in iterator]
    other = iter(_tf(stores, change))
    _one_line(lambda: tf.train.Checkpoint(iterator=other).read(path).assert_consumed(), key)
    same = iter(_tf(stores, built))
    tf.train.Checkpoint(iterator=same).read(path).assert_consumed()
    again = [x.numpy() for x, _ in same]
    assert len(again) == len(rest) and all(np.array_equal(a, b)
                                           for a, b in zip(again, rest, strict=True))


# -- Keras ------------------------------------------------------------------------------------
def test_a_keras_backup_restored_with_another_batch_size_is_one_line(
        stores: tuple[wk.Store, wk.Store], tmp_path: Path) -> None:
    class PreemptedError(Exception):
        pass

    class Preempt(keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if batch == 4:
                raise PreemptedError

    def fit(batch_size: int, *callbacks: keras.callbacks.Callback) -> None:
        ds = stores[0].keras_dataset("train", batch_size, seed=3)
        model = keras.Sequential([keras.Input((8, 3)), keras.layers.Flatten(),
                                  keras.layers.Dense(3), keras.layers.Reshape((1, 3))])
        model.compile("sgd", "mse")
        model.fit(ds, epochs=2, verbose=0,
                  callbacks=[ds.backup_and_restore(tmp_path / "backup", save_freq=2),
                             *callbacks])

    with pytest.raises(PreemptedError):
        fit(16, Preempt())
    _one_line(lambda: fit(64), "batch_size")
    fit(16)  # the reader it was saved for goes on


# -- positions: another number of shards, or batch size, is allowed; the rest is not ------------
def test_a_position_resumes_on_other_shards_but_not_into_another_order(
        stores: tuple[wk.Store, wk.Store]) -> None:
    ds = _torch(stores, {})
    position = json.loads(json.dumps(ds.position_after(3)))
    for change in ({"world_size": 2, "rank": 1}, {"batch_size": 8}):
        _torch(stores, change).resume(position)
    for change, key in [({"seed": 2}, "seed"), ({"shuffle": "global"}, "shuffle"),
                        ({"split": "val"}, "split"), ({"store": "b"}, "store_id")]:
        _one_line(lambda change=change: _torch(stores, change).resume(position), key)
