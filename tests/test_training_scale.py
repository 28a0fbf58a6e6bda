"""Training at scale: global shuffle, sharded reading, tf.distribute, resuming an
epoch in a new process, and the Keras reader under JAX."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import windowkit as wk
from tests.conftest import collect_epoch

ROOT = Path(__file__).resolve().parents[1]


def _tagged(lengths: list[int]) -> list[np.ndarray]:
    """Series whose feature 0 is the series number and feature 1 the row: a
    window says where it came from."""
    return [np.column_stack([np.full(n, s), np.arange(n), np.sin(np.arange(n) + s)]
                            ).astype(np.float32) for s, n in enumerate(lengths)]


def _sorted(x: np.ndarray) -> np.ndarray:
    flat = x.reshape(len(x), -1)
    return flat[np.lexsort(flat.T[::-1])]


@pytest.fixture
def store(tmp_path: Path, fmt: str) -> wk.Store:
    return wk.convert(_tagged([700, 333, 900, 50, 400, 610]), tmp_path / "s", format=fmt,
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
    np.testing.assert_array_equal(_sorted(first), _sorted(everything))
    np.testing.assert_array_equal(_sorted(second), _sorted(everything))
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
    np.testing.assert_array_equal(_sorted(epoch), _sorted(_every_window(store)))
    series = epoch[: len(epoch) // 32 * 32, 0, 0].reshape(-1, 32)
    assert np.mean([len(np.unique(b)) for b in series]) > 4  # 6 series, uniformly mixed


def test_global_shuffle_refuses_rows_beyond_its_budget(store: wk.Store) -> None:
    with pytest.raises(wk.InvalidSpecError, match=r"holds the rows of split 'train' in "
                       r"memory, .* more than memory_budget=1000"):
        store.tf_dataset("train", 32, shuffle="global", memory_budget=1000)
    with pytest.raises(wk.InvalidSpecError, match="memory_budget"):
        store.keras_dataset("train", 32, shuffle="global", memory_budget=1000)


@pytest.mark.parametrize("value", ["yes", "blocks", 2, None, "GLOBAL"])
def test_shuffle_takes_only_its_documented_values(store: wk.Store, value: object) -> None:
    with pytest.raises(wk.InvalidSpecError, match="shuffle must be True"):
        store.tf_dataset("train", 32, shuffle=value)  # type: ignore[arg-type]
    with pytest.raises(wk.InvalidSpecError, match="shuffle must be True"):
        store.keras_dataset("train", 32, shuffle=value)  # type: ignore[arg-type]


# -- 3. sharded reading -------------------------------------------------------------------
@pytest.mark.parametrize("shuffle", [True, False, "global"])
def test_shards_are_disjoint_cover_the_split_and_are_balanced(store: wk.Store,
                                                              shuffle: bool | str) -> None:
    everything = _every_window(store)
    per_block = store.read_plan("train").windows_per_block()
    parts = [collect_epoch(store.tf_dataset("train", 16, shuffle=shuffle, seed=3,
                                            num_shards=3, shard_index=i))[0]
             for i in range(3)]
    np.testing.assert_array_equal(_sorted(np.concatenate(parts)), _sorted(everything))
    even = len(everything) / 3  # each shard within one block's windows of an even share
    assert all(abs(len(p) - even) <= per_block.max() for p in parts), [len(p) for p in parts]
    for i, part in enumerate(parts):  # shard i's windows start in its own blocks only
        keras = store.keras_dataset("train", 16, shuffle=shuffle, seed=3, num_shards=3,
                                    shard_index=i)
        np.testing.assert_array_equal(
            _sorted(np.concatenate([keras[b][0] for b in range(len(keras))])), _sorted(part))


def test_a_shard_reads_only_its_own_blocks(tmp_path: Path) -> None:
    """Damage the last record of a TFRecord store: shard 0 (the first blocks) still
    reads, shard 1 names the damage."""
    store = wk.convert(_tagged([700, 900]), tmp_path / "s", format="tfrecord",
                       window=8, block_rows=64, shards=2)
    last = sorted((tmp_path / "s" / "data").glob("*.tfrecord"))[-1]
    blob = bytearray(last.read_bytes())
    blob[-20] ^= 0xFF
    last.write_bytes(bytes(blob))
    first, _ = collect_epoch(store.tf_dataset("train", 16, num_shards=2, shard_index=0))
    assert len(first) > 0
    with pytest.raises(Exception, match=r"CRC|crc|checksum"):
        collect_epoch(store.tf_dataset("train", 16, num_shards=2, shard_index=1))


def test_bad_shard_arguments_are_one_line(store: wk.Store) -> None:
    with pytest.raises(wk.InvalidSpecError, match=r"shard_index must be in 0\.\.1"):
        store.tf_dataset("train", 16, num_shards=2, shard_index=2)
    with pytest.raises(wk.InvalidSpecError, match="go together"):
        store.keras_dataset("train", 16, num_shards=2)
    with pytest.raises(wk.InvalidSpecError, match="too few for 1000 shards"):
        store.tf_dataset("train", 16, num_shards=1000, shard_index=999)
    import tensorflow as tf

    context = tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0,
                                         num_replicas_in_sync=2)
    with pytest.raises(wk.InvalidSpecError, match=r"batch_size: .*33.*divisible"):
        store.tf_dataset("train", 33, input_context=context)


_MIRRORED = textwrap.dedent("""
    import json, sys
    import numpy as np, tensorflow as tf, windowkit as wk
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    store = wk.open_store(sys.argv[1])
    dist = strategy.distribute_datasets_from_function(
        lambda ctx: store.tf_dataset("train", 32, shuffle=sys.argv[2] == "global" or True,
                                     seed=4, input_context=ctx)
        if sys.argv[2] == "blocks" else
        store.tf_dataset("train", 32, shuffle="global", seed=4, input_context=ctx))
    seen = []
    for x, _ in dist:
        seen += [v.numpy()[:, 0, :2].tolist() for v in strategy.experimental_local_results(x)]
    print(json.dumps(seen))
""")


@pytest.mark.parametrize("mode", ["blocks", "global"])
def test_mirrored_strategy_reads_every_window_once(tmp_path: Path, store: wk.Store,
                                                   mode: str) -> None:
    """Two logical CPUs, one input pipeline each through
    ``distribute_datasets_from_function``: each replica gets its share of the
    global batch, and together they read the split once."""
    script = tmp_path / "mirrored.py"
    script.write_text(_MIRRORED)
    proc = subprocess.run([sys.executable, str(script), str(store.path), mode],
                          capture_output=True, text=True, check=False, timeout=300,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3",
                               "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {len(b) for b in seen[:-2]} == {16}  # the replica's share of 32
    starts = sorted(tuple(w) for b in seen for w in b)
    expected = sorted(tuple(w) for w in _every_window(store)[:, 0, :2].tolist())
    assert starts == expected


# -- 4. resuming an epoch in a new process --------------------------------------------------
_RESUME = textwrap.dedent("""
    import json, sys
    import numpy as np, tensorflow as tf, windowkit as wk
    store_path, mode, ckpt, skip = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    shuffle = {"blocks": True, "global": "global"}[mode]
    ds = wk.open_store(store_path).tf_dataset("train", 16, shuffle=shuffle, seed=7).repeat(2)
    it = iter(ds)
    checkpoint = tf.train.Checkpoint(iterator=it)
    if skip >= 0:  # read `skip` batches, save, stop
        for _ in range(skip):
            next(it)
        checkpoint.write(ckpt)
        sys.exit(0)
    if skip == -2:
        checkpoint.read(ckpt).assert_consumed()
    print(json.dumps([b.numpy()[:, 0, :2].tolist() for b in it]))
""")


@pytest.mark.parametrize("mode", ["blocks", "global"])
def test_an_iterator_resumes_in_a_new_process(tmp_path: Path, fmt: str, mode: str) -> None:
    """Saved after k batches (in the second epoch), restored in a new process: the
    same batches as an uninterrupted run; in global mode the checkpoint holds
    positions only (block groups' also holds the batches in flight)."""
    store = wk.convert(_tagged([300, 260, 410]), tmp_path / "s", format=fmt, window=8,
                       block_rows=32)
    per_epoch = -(-store.num_windows("train") // 16)
    script = tmp_path / "resume.py"
    script.write_text(_RESUME)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT)}

    def run(skip: int) -> str:
        proc = subprocess.run([sys.executable, str(script), str(store.path), mode,
                               str(tmp_path / "ckpt"), str(skip)],
                              capture_output=True, text=True, env=env, check=False, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout

    whole = json.loads(run(-1))
    skip = per_epoch + 3
    run(skip)
    rest = json.loads(run(-2))
    assert rest == whole[skip:]
    if mode == "global":  # positions only, not rows or batches
        assert sum(p.stat().st_size for p in tmp_path.glob("ckpt*")) < 16 << 10


# -- 6. Keras 3 backends -------------------------------------------------------------------
def test_keras_dataset_trains_under_jax_without_tensorflow(tmp_path: Path) -> None:
    pytest.importorskip("jax")
    store = wk.convert(_tagged([300, 200]), tmp_path / "s", format="parquet",
                       window=wk.WindowSpec(8, horizon=1), block_rows=64)
    code = textwrap.dedent(f"""
        import sys
        import keras, windowkit as wk
        ds = wk.open_store({str(store.path)!r}).keras_dataset("train", 32, normalize=True)
        model = keras.Sequential([keras.Input((8, 3)), keras.layers.Flatten(),
                                  keras.layers.Dense(3), keras.layers.Reshape((1, 3))])
        model.compile("adam", "mse")
        history = model.fit(ds, epochs=1, verbose=0)
        assert keras.backend.backend() == "jax"
        assert "tensorflow" not in sys.modules, "TensorFlow was imported"
        print(len(history.history["loss"]))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "KERAS_BACKEND": "jax", "PYTHONPATH": str(ROOT)},
                          check=False, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("1")
