"""tf.data service: a TFRecord store's split read by tf.data workers in another
process, which know nothing of windowkit (no Python of ours runs there)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import windowkit as wk
from tests.helpers import sorted_rows, tagged_series

tf = pytest.importorskip("tensorflow")

_WORKERS = textwrap.dedent("""
    import sys
    import tensorflow as tf
    service = tf.data.experimental.service
    workers = [service.WorkerServer(service.WorkerConfig(dispatcher_address=sys.argv[1]))
               for _ in range(2)]
    print("ready", flush=True)
    sys.stdin.read()  # serve until the test closes our stdin
""")


@pytest.fixture(scope="module")
def dispatcher() -> Iterator[str]:
    """A dispatcher here, two workers in a child process (no windowkit there)."""
    service = tf.data.experimental.service
    server = service.DispatchServer(service.DispatcherConfig(port=0))
    address = server.target.split("://", 1)[1]
    proc = subprocess.Popen([sys.executable, "-c", _WORKERS, address], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3",
                                 "CUDA_VISIBLE_DEVICES": ""})
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield server.target
    finally:
        proc.kill()
        proc.wait()
        server._stop()


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_tfrecord_splits_read_by_tf_data_service_workers(tmp_path: Path, dispatcher: str,
                                                         compression: str) -> None:
    """Each epoch through the service holds every window of the split once, with
    its horizon; every batch but the last is full; the order is shuffled."""
    store = wk.convert(tagged_series([700, 333, 900, 50, 400, 610]), tmp_path / "s",
                       format="tfrecord", window=wk.WindowSpec(8, horizon=2), block_rows=64,
                       parts=4, compression=compression)
    x_all, y_all = store.windows("train", np.arange(store.num_windows("train")))
    want = sorted_rows(np.concatenate([x_all.reshape(len(x_all), -1),
                                   y_all.reshape(len(y_all), -1)], axis=1))
    ds = store.tf_dataset("train", 32, service=dispatcher, seed=1)
    for _ in range(2):  # each iteration is a new epoch
        batches = [(x.numpy(), y.numpy()) for x, y in ds]
        assert {len(x) for x, _ in batches[:-1]} == {32}
        x = np.concatenate([b[0] for b in batches])
        y = np.concatenate([b[1] for b in batches])
        np.testing.assert_array_equal(
            sorted_rows(np.concatenate([x.reshape(len(x), -1), y.reshape(len(y), -1)], axis=1)),
            want)
        assert not np.array_equal(x[:, 0, :2], x_all[:, 0, :2])  # shuffled


def test_a_split_reads_only_the_files_holding_its_windows(tmp_path: Path,
                                                          dispatcher: str) -> None:
    """Part files holding no window of the split are not opened (here they are
    garbage); normalized windows equal the local reader's."""
    import pyarrow.parquet as pq

    store = wk.convert(tagged_series([400, 500, 300, 450, 350, 380]), tmp_path / "s",
                       format="tfrecord", window=8, block_rows=64, parts=6,
                       splits="train=0.5,val=0.5", split_by="series", seed=2)
    local = np.concatenate([b.numpy() for b in store.tf_dataset("val", 16, shuffle=False,
                                                                normalize=True)])
    val_series = set(store.windows("val", np.arange(store.num_windows("val")))[:, 0, 0]
                     .astype(int).tolist())
    records = pq.read_table(store.path / "data" / "records.parquet").to_pandas()
    unused = set(records["shard"]) - set(records["shard"][records["series"].isin(val_series)])
    assert unused, "every part holds validation records: nothing to show"
    for part in unused:
        path = next((store.path / "data").glob(f"part-{part:05d}-of-*.tfrecord"))
        path.write_bytes(b"\xff" * path.stat().st_size)
    ds = store.tf_dataset("val", 16, service=dispatcher, shuffle=False, normalize=True)
    x = np.concatenate([b.numpy() for b in ds])
    np.testing.assert_allclose(sorted_rows(x), sorted_rows(local), rtol=1e-6)


@pytest.mark.parametrize(("fmt", "kwargs", "message"), [
    ("zarr", {}, "needs a store TensorFlow reads by itself"),
    ("parquet", {}, "needs a store TensorFlow reads by itself"),
    ("tfrecord", {"shuffle": "global"}, "shuffle='global' is not available"),
    ("tfrecord", {"num_shards": 2, "shard_index": 0}, "splits the files among its workers"),
])
def test_what_the_service_cannot_read_is_one_line(tmp_path: Path, fmt: str,
                                                  kwargs: dict[str, object],
                                                  message: str) -> None:
    store = wk.convert(tagged_series([300]), tmp_path / "s", format=fmt, window=8, block_rows=64)
    with pytest.raises(wk.InvalidSpecError, match=message):
        store.tf_dataset("train", 16, service="grpc://127.0.0.1:1", **kwargs)
