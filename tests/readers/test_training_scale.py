"""Training at scale: global shuffle, sharded reading, tf.distribute, resuming an
epoch in a new process, and the Keras reader under JAX."""

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

import windowkit as wk
from tests.conftest import CONCEPT_FORMAT, collect_epoch
from tests.helpers import free_ports, sorted_rows, tagged_series

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> wk.Store:
    """Six series on the concept format; read only (reading never writes: FormatTests)."""
    return wk.convert(tagged_series([700, 333, 900, 50, 400, 610]),
                      tmp_path_factory.mktemp("scale") / "s", format=CONCEPT_FORMAT,
                      window=wk.WindowSpec(8, horizon=2), block_rows=64)


def _every_window(store: wk.Store) -> np.ndarray:
    x, _ = store.windows("train", np.arange(store.num_windows("train")))
    return x


# -- 1. a true global shuffle ------------------------------------------------------------
def test_global_shuffle_is_a_new_permutation_each_epoch(store: wk.Store) -> None:
    everything = _every_window(store)
    ds = store.tf_dataset("train", 32, shuffle="global", seed=5)
    first, y = collect_epoch(ds)
    second, _ = collect_epoch(ds)
    assert y is not None and len(y) == len(first)
    np.testing.assert_array_equal(sorted_rows(first), sorted_rows(everything))
    np.testing.assert_array_equal(sorted_rows(second), sorted_rows(everything))
    assert not np.array_equal(first, second)
    again, _ = collect_epoch(store.tf_dataset("train", 32, shuffle="global", seed=5))
    np.testing.assert_array_equal(again, first)  # the seed fixes the epochs
    # the targets follow their windows: y starts where x ends (feature 1 is the row)
    np.testing.assert_array_equal(y[:, 0, 1], first[:, -1, 1] + 1)


def test_global_batches_mix_the_whole_split(store: wk.Store) -> None:
    """A batch of a global epoch holds about as many distinct series as a uniform
    permutation gives (block groups give fewer)."""
    x, _ = collect_epoch(store.tf_dataset("train", 64, shuffle="global", seed=1,
                                          drop_remainder=True))
    series = x[:, 0, 0].reshape(-1, 64)
    distinct = np.mean([len(np.unique(b)) for b in series])
    rng = np.random.default_rng(0)
    everything = _every_window(store)[:, 0, 0]
    uniform = np.mean([len(np.unique(rng.permutation(everything)[:64])) for _ in range(200)])
    assert distinct >= 0.9 * uniform, (distinct, uniform)


def test_keras_global_shuffle_is_a_permutation(store: wk.Store) -> None:
    ds = store.keras_dataset("train", 32, shuffle="global", seed=2)
    epoch = np.concatenate([ds[i][0] for i in range(len(ds))])
    np.testing.assert_array_equal(sorted_rows(epoch), sorted_rows(_every_window(store)))
    series = epoch[: len(epoch) // 32 * 32, 0, 0].reshape(-1, 32)
    assert np.mean([len(np.unique(b)) for b in series]) > 4  # 6 series, uniformly mixed


def test_global_shuffle_beyond_its_budget_reads_every_window_once(store: wk.Store) -> None:
    """Rows beyond memory_budget are spilled to local disk, not refused."""
    x, _ = collect_epoch(store.tf_dataset("train", 32, shuffle="global", memory_budget=1000))
    np.testing.assert_array_equal(sorted_rows(x), sorted_rows(_every_window(store)))
    ds = store.keras_dataset("train", 32, shuffle="global", memory_budget=1000)
    epoch = np.concatenate([ds[i][0] for i in range(len(ds))])
    np.testing.assert_array_equal(sorted_rows(epoch), sorted_rows(_every_window(store)))


@pytest.mark.parametrize("value", ["yes", "block", 2, None, "GLOBAL"])
def test_shuffle_takes_only_its_documented_values(store: wk.Store, value: object) -> None:
    with pytest.raises(wk.InvalidSpecError, match="shuffle must be True"):
        store.tf_dataset("train", 32, shuffle=value)  # type: ignore[arg-type]
    with pytest.raises(wk.InvalidSpecError, match="shuffle must be True"):
        store.keras_dataset("train", 32, shuffle=value)  # type: ignore[arg-type]


# -- 3. sharded reading -------------------------------------------------------------------
# each mode runs once, on the concept format (tests/conftest.py): sharding and
# resuming are the same for every format (reading by each format: FormatTests)


@pytest.mark.parametrize("shuffle", [True, False, "global", "blocks"])
def test_shards_are_disjoint_cover_the_split_and_are_balanced(store: wk.Store,
                                                              shuffle: bool | str) -> None:
    """Three shards, tf.data and Keras: the same windows in the same order per shard,
    disjoint, covering, their shares within one window of each other, every
    shard as many windows (a short one repeats its last)."""
    everything = _every_window(store)
    for drop in (False, True):
        parts = [collect_epoch(store.tf_dataset("train", 16, shuffle=shuffle, seed=3,
                                                num_shards=3, shard_index=i,
                                                drop_remainder=drop))[0]
                 for i in range(3)]
        keras_parts = []
        for i in range(3):
            keras = store.keras_dataset("train", 16, shuffle=shuffle, seed=3, num_shards=3,
                                        shard_index=i, drop_remainder=drop)
            keras_parts.append(np.concatenate([keras[b][0] for b in range(len(keras))]))
        assert len({len(p) for p in parts + keras_parts}) == 1  # every shard steps together
        own = [np.unique(p.reshape(len(p), -1), axis=0) for p in parts]
        for part, mine in zip(parts, own, strict=True):
            assert len(part) - len(mine) <= (0 if drop else 1)
        for part, keras_part in zip(parts, keras_parts, strict=True):  # the same order
            np.testing.assert_array_equal(keras_part, part)
        together = np.concatenate(own)
        assert len(np.unique(together, axis=0)) == len(together)  # disjoint
        if drop:  # each shard the smallest share, whole batches: < a batch each left out
            assert len(everything) - len(together) <= 2 + 3 * 15
        else:
            np.testing.assert_array_equal(sorted_rows(together.reshape(everything.shape)),
                                          sorted_rows(everything))


def test_a_shard_reads_only_its_own_blocks(tmp_path: Path) -> None:
    """Damage the last record of a TFRecord store: shard 0 (the first blocks) still
    reads, shard 1 names the damage."""
    store = wk.convert(tagged_series([700, 900]), tmp_path / "s", format="tfrecord",
                       window=8, block_rows=64, parts=2)
    last = sorted((tmp_path / "s" / "data").glob("*.tfrecord"))[-1]
    blob = bytearray(last.read_bytes())
    blob[-20] ^= 0xFF
    last.write_bytes(bytes(blob))
    first, _ = collect_epoch(store.tf_dataset("train", 16, shuffle="blocks", num_shards=2,
                                              shard_index=0))
    assert len(first) > 0
    with pytest.raises(Exception, match=r"CRC|crc|checksum"):
        collect_epoch(store.tf_dataset("train", 16, shuffle="blocks", num_shards=2,
                                       shard_index=1))


def test_bad_shard_arguments_are_one_line(store: wk.Store) -> None:
    with pytest.raises(wk.InvalidSpecError, match=r"shard_index must be in 0\.\.1"):
        store.tf_dataset("train", 16, num_shards=2, shard_index=2)
    with pytest.raises(wk.InvalidSpecError, match="go together"):
        store.keras_dataset("train", 16, num_shards=2)
    over = store.num_windows("train") + 1  # fewer windows than shards: one line
    with pytest.raises(wk.InvalidSpecError, match=f"too few for {over} shards"):
        store.tf_dataset("train", 16, shuffle="blocks", num_shards=over, shard_index=over - 1)
    with pytest.raises(wk.InvalidSpecError, match=f"too few for {over} shards"):
        store.torch_dataset("train", 16, rank=0, world_size=over)
    with pytest.raises(wk.InvalidSpecError, match="too few for 100000 shards"):
        store.tf_dataset("train", 16, num_shards=100_000, shard_index=9)
    import tensorflow as tf

    context = tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0,
                                         num_replicas_in_sync=2)
    with pytest.raises(wk.InvalidSpecError, match=r"batch_size: .*33.*divisible"):
        store.tf_dataset("train", 33, input_context=context)


DISTRIBUTED_MODES = ["blocks", "global"]

_MIRRORED = textwrap.dedent("""
    import json, sys
    import numpy as np, tensorflow as tf, windowkit as wk
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    store = wk.open_store(sys.argv[1])
    out = {}
    for mode in json.loads(sys.argv[2]):
        shuffle = {"blocks": "blocks", "global": "global"}[mode]
        dist = strategy.distribute_datasets_from_function(
            lambda ctx, shuffle=shuffle: store.tf_dataset(
                "train", 32, shuffle=shuffle, seed=4, input_context=ctx))
        seen = []
        for x, _ in dist:
            seen += [v.numpy()[:, 0, :2].tolist() for v in strategy.experimental_local_results(x)]
        out[mode] = seen
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def mirrored(tmp_path_factory: pytest.TempPathFactory, store: wk.Store) -> dict[str, Any]:
    """What each replica saw in each mode (both modes in one process)."""
    script = tmp_path_factory.mktemp("mirrored") / "mirrored.py"
    script.write_text(_MIRRORED)
    proc = subprocess.run([sys.executable, str(script), str(store.path),
                           json.dumps(DISTRIBUTED_MODES)],
                          capture_output=True, text=True, check=False, timeout=300,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3",
                               "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("mode", DISTRIBUTED_MODES)
def test_mirrored_strategy_reads_every_window_once(mirrored: dict[str, Any], store: wk.Store,
                                                   mode: str) -> None:
    """Two logical CPUs, one input pipeline each through
    ``distribute_datasets_from_function``: each replica gets its share of the
    global batch, and together they read the split once."""
    seen = mirrored[mode]
    assert {len(b) for b in seen[:-2]} == {16}  # the replica's share of 32
    starts = sorted(tuple(w) for b in seen for w in b)
    expected = sorted(tuple(w) for w in _every_window(store)[:, 0, :2].tolist())
    assert starts == expected


_MULTI_WORKER = textwrap.dedent("""
    import json, os, sys
    import numpy as np, tensorflow as tf, windowkit as wk
    store_path, modes, steps = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    store = wk.open_store(store_path)

    @tf.function
    def step(x):  # an all-reduce across the two workers, as a training step makes
        count = strategy.run(lambda x: tf.cast(tf.shape(x)[0], tf.float32), args=(x,))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, count, axis=None)

    out = {}
    for mode in modes:  # one mode after the other, on the same two workers
        shuffle = {"blocks": "blocks", "global": "global"}[mode]
        dist = strategy.distribute_datasets_from_function(
            lambda ctx, shuffle=shuffle: store.tf_dataset(
                "train", 32, shuffle=shuffle, seed=4, input_context=ctx))
        seen, reduced = [], []
        for i, (x, _) in enumerate(dist):
            if i < steps:  # steps every worker has (shards differ by up to a block)
                reduced.append(float(step(x)))
            seen += [v.numpy()[:, 0, :2].tolist() for v in strategy.experimental_local_results(x)]
        out[mode] = {"seen": seen, "reduced": reduced}
    print(json.dumps(out))
""")


def _multi_worker_steps(store: wk.Store) -> int:
    return store.num_windows("train") // 2 // 16  # every shard has as many windows


@pytest.fixture(scope="module")
def multi_worker(tmp_path_factory: pytest.TempPathFactory, store: wk.Store
                 ) -> list[dict[str, Any]]:
    """Two worker processes (``TF_CONFIG`` on 127.0.0.1) reading each mode in
    turn: what each worker saw and reduced, by mode."""
    script = tmp_path_factory.mktemp("multi_worker") / "multi_worker.py"
    script.write_text(_MULTI_WORKER)
    workers = [f"127.0.0.1:{port}" for port in free_ports(2)]
    procs = []
    for index in range(2):
        config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        procs.append(subprocess.Popen(
            [sys.executable, str(script), str(store.path), json.dumps(DISTRIBUTED_MODES),
             str(_multi_worker_steps(store))],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT),
                 "TF_CONFIG": json.dumps(config), "CUDA_VISIBLE_DEVICES": ""}))
    outputs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err[-3000:]
            outputs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            proc.kill()
    return outputs


@pytest.mark.parametrize("mode", DISTRIBUTED_MODES)
def test_multi_worker_mirrored_strategy_reads_every_window_once(
        multi_worker: list[dict[str, Any]], store: wk.Store, mode: str) -> None:
    """Two worker processes (``TF_CONFIG`` on 127.0.0.1), one input pipeline
    each: each reads its own shard at 16 windows of a global 32, the steps
    all-reduce across both, and together they read the split once."""
    outputs = [worker[mode] for worker in multi_worker]
    total, steps = store.num_windows("train"), _multi_worker_steps(store)
    for out in outputs:
        assert out["reduced"] == [32.0] * steps  # 16 from each worker, every step
        sizes = [len(b) for b in out["seen"] if b]  # empty: the other worker goes on
        assert set(sizes[:-1]) == {16}
    shards = [{tuple(w) for b in out["seen"] for w in b} for out in outputs]
    assert not shards[0] & shards[1]
    expected = sorted(tuple(w) for w in _every_window(store)[:, 0, :2].tolist())
    assert sorted(shards[0] | shards[1]) == expected
    read = sum(len(b) for out in outputs for b in out["seen"])
    assert total <= read <= total + 1  # a short shard repeats its last window


# -- 4. resuming an epoch in a new process --------------------------------------------------
RESUME_MODES = ["blocks", "global", "spilled"]

_RESUME = textwrap.dedent("""
    import json, sys
    import numpy as np, tensorflow as tf, windowkit as wk
    from tests.readers.test_training_scale import resume_dataset
    store_path, ckpts, skip = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    rests = {}
    for mode, ckpt in ckpts.items():  # each mode's iterator on its own, in turn
        it = iter(resume_dataset(store_path, mode))
        checkpoint = tf.train.Checkpoint(iterator=it)
        if skip >= 0:  # read `skip` batches, save, go on to the next mode
            for _ in range(skip):
                next(it)
            checkpoint.write(ckpt)
            continue
        checkpoint.read(ckpt).assert_consumed()
        rests[mode] = [b.numpy()[:, 0, :2].tolist() for b in it]
    print(json.dumps(rests))
""")


def resume_dataset(store_path: str, mode: str) -> Any:
    """Two epochs of ``tf_dataset`` in ``mode`` (``spilled``: the rows beyond a
    2 KiB budget spilled to local disk), as the resume test reads them."""
    shuffle = {"blocks": "blocks", "global": "global", "spilled": "global"}[mode]
    budget = 2048 if mode == "spilled" else None
    return wk.open_store(store_path).tf_dataset("train", 16, shuffle=shuffle, seed=7,
                                                memory_budget=budget).repeat(2)


@pytest.fixture(scope="module")
def resumed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A store; each mode's iterator saved after ``skip`` batches (in the second
    epoch), all in one process, then restored and read to its end in a new
    one (one process each way: a process start is most of the time)."""
    tmp = tmp_path_factory.mktemp("resume")
    store = wk.convert(tagged_series([300, 260, 410]), tmp / "s", format=CONCEPT_FORMAT,
                       window=8, block_rows=32)
    skip = -(-store.num_windows("train") // 16) + 3
    ckpts = {mode: str(tmp / mode / "ckpt") for mode in RESUME_MODES}
    for mode in RESUME_MODES:
        (tmp / mode).mkdir()
    script = tmp / "resume.py"
    script.write_text(_RESUME)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "1", "PYTHONPATH": str(ROOT)}

    def run(skip: int) -> str:
        proc = subprocess.run([sys.executable, str(script), str(store.path), json.dumps(ckpts),
                               str(skip)],
                              capture_output=True, text=True, env=env, check=False, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "FAILED_PRECONDITION" not in proc.stderr, proc.stderr[-2000:]
        return proc.stdout

    run(skip)
    rests = json.loads(run(-2).strip().splitlines()[-1])
    return {"store": store, "skip": skip, "rests": rests,
            "ckpt_bytes": {mode: sum(p.stat().st_size for p in (tmp / mode).glob("ckpt*"))
                           for mode in RESUME_MODES}}


@pytest.mark.parametrize("mode", RESUME_MODES)
def test_an_iterator_resumes_in_a_new_process(resumed: dict[str, Any], mode: str) -> None:
    """Saved after k batches (in the second epoch), restored in a new process: the
    same batches as an uninterrupted run; the checkpoint holds positions, not
    the batches in flight; and symbolic checkpointing logs no warning (a
    stateful row reader would make it log one for every group read)."""
    store, skip = resumed["store"], resumed["skip"]
    whole = [b.numpy()[:, 0, :2].tolist() for b in resume_dataset(str(store.path), mode)]
    assert resumed["rests"][mode] == whole[skip:]
    # positions (and a batch's worth of carried windows at most), not rows or batches
    assert 0 < resumed["ckpt_bytes"][mode] < 16 << 10


_KERAS_RESUME = textwrap.dedent("""
    import json, sys
    import keras, numpy as np, windowkit as wk
    stores, runs = json.loads(sys.argv[1]), json.loads(sys.argv[2])

    class Preempted(Exception):
        pass

    class Preempt(keras.callbacks.Callback):  # the machine goes away after n batches
        def __init__(self, n):
            super().__init__()
            self.n = n
        def on_train_batch_end(self, batch, logs=None):
            self.n -= 1
            if self.n == 0:
                raise Preempted

    def fit(backup, stop_after):
        keras.utils.set_random_seed(0)
        weights = []
        for i, path in enumerate(stores):
            ds = wk.open_store(path).keras_dataset("train", 16, seed=3)
            model = keras.Sequential([keras.Input((8, 3)), keras.layers.Flatten(),
                                      keras.layers.Dense(3, kernel_initializer="ones"),
                                      keras.layers.Reshape((1, 3))])
            model.compile(keras.optimizers.SGD(0.01), "mse")
            callbacks = []
            if backup != "-":
                callbacks.append(ds.backup_and_restore(f"{backup}/{i}", save_freq=2))
            if stop_after > 0:
                callbacks.append(Preempt(stop_after))
            try:
                model.fit(ds, epochs=3, shuffle=False, verbose=0, callbacks=callbacks)
            except Preempted:
                continue
            weights.append([w.tolist() for w in model.get_weights()])
        return weights

    print(json.dumps([fit(backup, stop_after) for backup, stop_after in runs]))
""")


@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_keras_fit_resumes_at_the_batch_where_it_stopped(tmp_path: Path, backend: str
                                                         ) -> None:
    """``fit`` preempted twice mid-epoch (the second time during the resumed
    epoch) and restored each time in a new process from
    ``backup_and_restore(save_freq=2)`` ends with exactly the weights of an
    uninterrupted run: the same batches, in the same order, none twice. (The
    uninterrupted run shares the first preempted run's process, before it.)"""
    if backend == "jax":
        pytest.importorskip("jax")
    rng = np.random.default_rng(5)
    stores = [str(wk.convert([rng.normal(size=(n, 3)).astype(np.float32) for n in (150, 90)],
                             tmp_path / fmt, format=fmt, window=wk.WindowSpec(8, horizon=1),
                             block_rows=32).path) for fmt in wk.FORMAT_NAMES]
    per_epoch = -(-wk.open_store(stores[0]).num_windows("train") // 16)
    script = tmp_path / "keras_resume.py"
    script.write_text(_KERAS_RESUME)
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3",
           "PYTHONPATH": str(ROOT), "TF_DETERMINISTIC_OPS": "1"}

    def fit(*runs: tuple[str, int]) -> list[list[object]]:
        """Each ``(backup, stop_after)`` run in turn, in one new process."""
        proc = subprocess.run([sys.executable, str(script), json.dumps(stores),
                               json.dumps(runs)], capture_output=True, text=True, env=env,
                              check=False, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "ran out of data" not in proc.stderr
        return list(json.loads(proc.stdout.strip().splitlines()[-1]))

    backup = str(tmp_path / "backup")
    # preempted in epoch 2, after its save at 4
    whole, preempted = fit(("-", 0), (backup, per_epoch + 5))
    assert preempted == []
    assert fit((backup, 3)) == [[]]  # preempted again, 3 batches into the resumed epoch
    [resumed] = fit((backup, 0))
    assert len(resumed) == len(whole) == len(stores)
    for got, want in zip(resumed, whole, strict=True):
        for a, b in zip(got, want, strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
    assert not (tmp_path / "backup" / "0").exists()  # removed once fit has ended


def test_a_dataset_seeks_to_a_batch_of_an_epoch(tmp_path: Path) -> None:
    ds = wk.convert(tagged_series([300, 200]), tmp_path / "s", format="zarr",
                    window=8, block_rows=64).keras_dataset("train", 16, seed=1)
    ds.epoch = 2
    whole = [ds[i] for i in range(len(ds))]
    ds.seek(2, 5)
    assert ds.position == (2, 5) and len(ds) == len(whole) - 5
    np.testing.assert_array_equal(np.concatenate([ds[i] for i in range(len(ds))]),
                                  np.concatenate(whole[5:]))
    ds.on_epoch_end()
    assert ds.position == (3, 0) and len(ds) == len(whole)
    with pytest.raises(wk.InvalidSpecError, match="beyond the epoch"):
        ds.seek(3, len(whole) + 1)


# -- 6. Keras 3 backends -------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["tensorflow", "jax", "torch"])
def test_keras_dataset_trains_on_every_backend(tmp_path: Path, backend: str) -> None:
    """``fit`` on ``keras_dataset`` from a store of each format under each Keras
    backend, in a new process; under JAX and torch TensorFlow is never imported."""
    pytest.importorskip({"tensorflow": "tensorflow", "jax": "jax", "torch": "torch"}[backend])
    stores = [str(wk.convert(tagged_series([300, 200]), tmp_path / fmt, format=fmt,
                             window=wk.WindowSpec(8, horizon=1), block_rows=64).path)
              for fmt in wk.FORMAT_NAMES]
    code = textwrap.dedent(f"""
        import sys
        import keras, windowkit as wk
        losses = []
        for path in {stores!r}:
            ds = wk.open_store(path).keras_dataset("train", 32, normalize=True)
            model = keras.Sequential([keras.Input((8, 3)), keras.layers.Flatten(),
                                      keras.layers.Dense(3), keras.layers.Reshape((1, 3))])
            model.compile("adam", "mse")
            history = model.fit(ds, epochs=2, verbose=0, shuffle=False)
            losses.append(history.history["loss"])
        assert keras.backend.backend() == {backend!r}
        if {backend!r} != "tensorflow":
            assert "tensorflow" not in sys.modules, "TensorFlow was imported"
        assert all(len(l) == 2 and l[1] < l[0] for l in losses), losses
        print(len(losses))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "KERAS_BACKEND": backend, "PYTHONPATH": str(ROOT),
                               "TF_CPP_MIN_LOG_LEVEL": "3"},
                          check=False, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("3")


def test_importing_and_converting_load_no_framework(tmp_path: Path) -> None:
    """windowkit, a conversion in every format and random access import no
    deep-learning framework: TensorFlow, Keras, torch, Grain or JAX come only
    with the reader that needs them."""
    code = textwrap.dedent(f"""
        import sys
        import numpy as np
        import windowkit as wk
        for fmt in wk.FORMAT_NAMES:
            store = wk.convert([np.ones((50, 2), np.float32)], {str(tmp_path)!r} + "/" + fmt,
                               format=fmt, window=4)
            wk.open_store(store.path).windows("train", [0, 1])
        loaded = [m for m in ("tensorflow", "keras", "torch", "grain", "jax") if m in sys.modules]
        assert not loaded, loaded
        print("ok")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "ok"
