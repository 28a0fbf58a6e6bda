"""A store replaced (``convert --overwrite``) under a reader whose rows are held
once, spilled beyond ``memory_budget`` or in memory: ``tf_dataset(shuffle=
"global")`` and a ``grain_source`` raise :class:`windowkit.StoreReplacedError`,
at the next epoch at the latest (Grain, which has no epochs: within a pass over
the split, or a second), and never serve the old store's rows on, in every format.
"""

from __future__ import annotations

import pickle
import time
from pathlib import Path

import numpy as np
import pytest

import windowkit as wk
from windowkit.readers import grain as grain_reader

FORMATS = ["zarr", "parquet", "tfrecord"]
TINY = 1024  # bytes of memory_budget: far below the rows (5.6 KB), so they are spilled
REPLACED = "replaced while it was being read"


def _convert(path: Path, fmt: str, value: float) -> wk.Store:
    series = [np.full((400, 2), value, np.float32), np.full((300, 2), value, np.float32)]
    return wk.convert(series, path, format=fmt, window=wk.WindowSpec(4), block_rows=64,
                      overwrite=True)


@pytest.fixture(params=FORMATS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> wk.Store:
    store = _convert(tmp_path / "store", request.param, 1.0)
    assert store.read_plan("train").rows_bytes() > TINY
    return store


def _replace(store: wk.Store) -> None:
    _convert(store.path, store.manifest.format, 2.0)


def _values(batches: object) -> set[float]:
    return {float(v) for batch in batches for v in np.unique(np.asarray(batch))}


@pytest.mark.parametrize("same_epoch", [False, True], ids=["next-epoch", "same-epoch-again"])
def test_tf_global_shuffle_sees_the_replacement(store: wk.Store, same_epoch: bool) -> None:
    """The next iteration raises, also when it reads the same epoch number again
    (what a distributed dataset, or Keras ``fit`` without the epoch callback, does)."""
    pytest.importorskip("tensorflow")
    ds = store.tf_dataset("train", 64, shuffle="global", memory_budget=TINY)
    assert _values(ds) == {1.0}
    _replace(store)
    for _ in range(2):  # and every epoch after
        if same_epoch:
            ds.set_epoch(0)
        with pytest.raises(Exception, match=REPLACED) as caught:
            _values(ds)
        assert "tensorflow" in type(caught.value).__module__ or isinstance(
            caught.value, wk.StoreReplacedError)


@pytest.mark.parametrize("budget", [TINY, None], ids=["spilled", "in-memory"])
def test_grain_sees_the_replacement_within_a_pass(store: wk.Store, budget: int | None) -> None:
    src = store.grain_source("train", memory_budget=budget)
    assert src._rows().spilled == (budget == TINY)
    assert _values(src[i] for i in range(len(src))) == {1.0}
    _replace(store)
    with pytest.raises(wk.StoreReplacedError, match=REPLACED):
        for i in range(len(src)):  # a pass over the split at most
            assert float(src[i].max()) == 1.0  # the old rows, until the check
    with pytest.raises(wk.StoreReplacedError, match=REPLACED):
        src[0]  # and on every read after


def test_grain_batched_reads_see_the_replacement(store: wk.Store) -> None:
    src = store.grain_source("train", memory_budget=TINY)
    everything = list(range(len(src)))
    assert _values(src._getitems(everything)) == {1.0}
    _replace(store)
    with pytest.raises(wk.StoreReplacedError, match=REPLACED):
        src._getitems(everything)  # a pass's worth: checked first


def test_grain_sees_the_replacement_within_a_second(store: wk.Store) -> None:
    src = store.grain_source("train", memory_budget=TINY)
    src[0]
    _replace(store)
    time.sleep(grain_reader.CHECK_SECONDS + 0.1)
    with pytest.raises(wk.StoreReplacedError, match=REPLACED):
        src[1]


def test_a_grain_worker_sees_the_replacement(store: wk.Store) -> None:
    src = store.grain_source("train", memory_budget=TINY)
    src[0]
    shipped = pickle.dumps(src)  # what a Grain worker process receives
    _replace(store)
    with pytest.raises(wk.StoreReplacedError, match=REPLACED):
        pickle.loads(shipped)[0]


def test_a_store_left_alone_is_read_on(store: wk.Store) -> None:
    """The checks cost a stat, and say nothing while the store stays."""
    src = store.grain_source("train", memory_budget=TINY)
    for _ in range(3):
        assert _values(src[i] for i in range(len(src))) == {1.0}
        assert _values(src._getitems(list(range(len(src))))) == {1.0}
