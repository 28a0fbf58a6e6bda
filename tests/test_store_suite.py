"""The behaviour every format shares, run once per implemented format.

Round trips compare against the NumPy oracle: random access (``windows``) in
index order must be bit-identical; a ``tf_dataset`` epoch must hold exactly the
oracle's windows, each once.
"""

from __future__ import annotations

import pickle
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import windowkit as wk
from tests.conftest import assert_windows_equal, collect_epoch, oracle_windows
from windowkit.formats import get_format

DTYPES = [np.float16, np.float32, np.float64, np.int32]
STEP_SHAPES = st.sampled_from([(), (1,), (3,), (2, 3, 2)])


@st.composite
def datasets(draw: st.DrawFn) -> tuple[list[np.ndarray], wk.WindowSpec, int]:
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    step = draw(STEP_SHAPES)
    spec = wk.WindowSpec(length=draw(st.integers(1, 6)), stride=draw(st.integers(1, 3)),
                         sampling_rate=draw(st.integers(1, 3)), horizon=draw(st.integers(0, 3)))
    # at least one series holds a window (else convert refuses: tests/test_bad_input.py)
    lengths = draw(st.lists(st.integers(1, 50), min_size=0, max_size=3))
    lengths.insert(draw(st.integers(0, len(lengths))), draw(st.integers(spec.span, 50)))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    series = []
    for n in lengths:
        if dtype.kind == "f":
            values = rng.normal(0, 100, size=(n, *step)).astype(dtype)
        else:
            values = rng.integers(-(2**31), 2**31 - 1, size=(n, *step)).astype(dtype)
        series.append(values)
    block_rows = draw(st.integers(1, 24))
    return series, spec, block_rows


def _convert(tmp: str, fmt: str, series: list[np.ndarray], spec: wk.WindowSpec,
             block_rows: int | None = None) -> wk.Store:
    return wk.convert(series, Path(tmp) / "store", format=fmt, window=spec,
                      block_rows=block_rows)


@given(data=datasets())
def test_random_access_equals_oracle(fmt: str, data: tuple) -> None:
    series, spec, block_rows = data
    expected_x, expected_y = oracle_windows(series, spec)
    with tempfile.TemporaryDirectory() as tmp:
        store = _convert(tmp, fmt, series, spec, block_rows)
        assert store.num_windows("train") == len(expected_x)
        assert store.dtype == series[0].dtype
        assert store.step_shape == series[0].shape[1:]
        got = store.windows("train", np.arange(len(expected_x)))
        if spec.horizon:
            assert isinstance(got, tuple)
            np.testing.assert_array_equal(got[0], expected_x)
            np.testing.assert_array_equal(got[1], expected_y)
        else:
            np.testing.assert_array_equal(got, expected_x)
        assert got[0].dtype == series[0].dtype if spec.horizon else got.dtype == series[0].dtype


@given(data=datasets(), batch_size=st.integers(1, 40), shuffle=st.booleans(),
       cache_bytes=st.sampled_from([1, 1 << 12, 1 << 20]))
def test_tf_dataset_epoch_holds_every_window_once(fmt: str, data: tuple, batch_size: int,
                                                  shuffle: bool, cache_bytes: int) -> None:
    series, spec, block_rows = data
    expected_x, expected_y = oracle_windows(series, spec)
    with tempfile.TemporaryDirectory() as tmp:
        store = _convert(tmp, fmt, series, spec, block_rows)
        ds = store.tf_dataset("train", batch_size, shuffle=shuffle, seed=3,
                              cache_bytes=cache_bytes)
        assert ds.cardinality().numpy() == -(-len(expected_x) // batch_size)
        x, y = collect_epoch(ds)
    assert x.dtype == series[0].dtype
    assert_windows_equal(x, y, expected_x, expected_y, in_order=not shuffle)


def _numbered_series(lengths: list[int], features: int = 2) -> list[np.ndarray]:
    """Series whose every row is unique: value = global row id (and a feature tag)."""
    out, base = [], 0
    for n in lengths:
        rows = np.arange(base, base + n, dtype=np.float64)[:, None]
        out.append(np.concatenate([rows] + [rows + 0.5] * (features - 1), axis=1))
        base += n
    return out


def test_shuffled_epochs_visit_each_window_once_in_new_orders(fmt: str, tmp_path: Path) -> None:
    series = _numbered_series([500, 320, 7, 260])
    spec = wk.WindowSpec(5, stride=2)
    store = wk.convert(series, tmp_path / "s", format=fmt, window=spec, block_rows=16)
    expected_first_rows = oracle_windows(series, spec)[0][:, 0, 0]
    ds = store.tf_dataset("train", 32, shuffle=True, seed=11, cache_bytes=1 << 12)
    epochs = [collect_epoch(ds)[0][:, 0, 0] for _ in range(2)]
    for first_rows in epochs:
        assert len(first_rows) == len(expected_first_rows)
        assert sorted(first_rows.tolist()) == sorted(expected_first_rows.tolist())
    assert not np.array_equal(epochs[0], epochs[1]), "second epoch came in the same order"
    assert not np.array_equal(epochs[0], np.sort(epochs[0])), "epoch was not shuffled"
    again = store.tf_dataset("train", 32, shuffle=True, seed=11, cache_bytes=1 << 12)
    np.testing.assert_array_equal(collect_epoch(again)[0][:, 0, 0], epochs[0])


def test_small_store_shuffle_mixes_the_whole_split(fmt: str, tmp_path: Path) -> None:
    """When the cache holds every block, a batch draws from the whole split."""
    series = _numbered_series([4000])
    store = wk.convert(series, tmp_path / "s", format=fmt, window=8, block_rows=64)
    first = next(iter(store.tf_dataset("train", 256, seed=0)))[:, 0, 0].numpy()
    blocks = np.unique(first // 64)
    assert len(blocks) > 40  # of 63 blocks: windows come from all over the split


def test_drop_remainder_gives_static_batch_dimension(fmt: str, tmp_path: Path) -> None:
    store = wk.convert(_numbered_series([100]), tmp_path / "s", format=fmt,
                       window=wk.WindowSpec(4, horizon=2))
    ds = store.tf_dataset("train", 16, drop_remainder=True)
    x_spec, y_spec = ds.element_spec
    assert tuple(x_spec.shape) == (16, 4, 2) and tuple(y_spec.shape) == (16, 2, 2)
    assert ds.cardinality().numpy() == 95 // 16
    assert sum(1 for _ in ds) == 95 // 16
    loose = store.tf_dataset("train", 16)
    assert tuple(loose.element_spec[0].shape) == (None, 4, 2)
    assert loose.cardinality().numpy() == -(-95 // 16)


def test_normalize_uses_column_statistics(fmt: str, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    values = rng.normal([10.0, -3.0, 0.0], [2.0, 0.5, 1e-9], size=(2000, 3)).astype(np.float32)
    values[:, 2] = 7.0  # a constant column: shifted, never divided by zero
    store = wk.convert([values], tmp_path / "s", format=fmt, window=16)
    stats = store.info["normalization"]
    np.testing.assert_allclose(stats["mean"], values.astype(np.float64).mean(axis=0), rtol=1e-9)
    np.testing.assert_allclose(stats["std"], values.astype(np.float64).std(axis=0), rtol=1e-9,
                               atol=1e-12)
    x = collect_epoch(store.tf_dataset("train", 128, shuffle=False, normalize=True))[0]
    assert x.dtype == np.float32 and np.isfinite(x).all()
    expected = (values - np.float32(stats["mean"])) / np.where(
        np.array(stats["std"]) > 0, np.array(stats["std"]), 1.0).astype(np.float32)
    np.testing.assert_allclose(x[:, 0], expected[: len(x)], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(x[:, :, 2], 0.0)
    np.testing.assert_allclose(store.windows("train", [0], normalize=True)[0], x[0], rtol=1e-6)


def test_normalize_is_per_channel_for_frames(fmt: str, tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    frames = rng.normal(0, 1, size=(300, 2, 4, 4)).astype(np.float32)
    frames[:, 1] = frames[:, 1] * 5 + 100
    store = wk.convert([frames], tmp_path / "s", format=fmt, window=wk.WindowSpec(3, horizon=1))
    assert len(store.info["normalization"]["mean"]) == 2
    x, y = collect_epoch(store.tf_dataset("train", 64, normalize=True))
    assert x.shape[1:] == (3, 2, 4, 4) and y.shape[1:] == (1, 2, 4, 4)
    assert abs(float(x[:, :, 1].mean())) < 0.1 and abs(float(x[:, :, 1].std()) - 1) < 0.1


def test_store_pickles_and_reopens(fmt: str, tmp_path: Path) -> None:
    series = _numbered_series([80, 40])
    store = wk.convert(series, tmp_path / "s", format=fmt, window=6, block_rows=8)
    before = store.windows("train", [0, 50, 100])
    clone = pickle.loads(pickle.dumps(store))
    np.testing.assert_array_equal(clone.windows("train", [0, 50, 100]), before)


def test_windows_rejects_positions_out_of_range(fmt: str, tmp_path: Path) -> None:
    store = wk.convert(_numbered_series([20]), tmp_path / "s", format=fmt, window=5)
    with pytest.raises(IndexError, match="window position 16 is out of range for 16 windows"):
        store.windows("train", [0, 16])
    with pytest.raises(wk.InvalidSpecError, match="split 'val' is not in store"):
        store.windows("val", [0])


def test_index_table_and_manifest(fmt: str, tmp_path: Path) -> None:
    series = _numbered_series([30, 3, 12])
    spec = wk.WindowSpec(4, stride=3, horizon=1)
    store = wk.convert(series, tmp_path / "s", format=fmt, window=spec)
    index = store.index("train")
    expected = [(s, r, 4) for s, n in enumerate([30, 3, 12]) for r in range(0, n - 4, 3)]
    assert index.tolist() == [list(t) for t in expected]
    info = store.info
    assert info["format"] == fmt and info["format_version"] == 1
    assert info["splits"]["train"]["windows"] == len(expected)
    assert info["series"] == {"count": 3, "too_short": 1, "gap_skipped_windows": 0,
                              "nan_skipped_windows": 0, "missing_rows": 0}
    assert info["window"] == spec.to_dict()
    assert info["dtype"] == "float64" and info["step_shape"] == [2]
    on_disk = {str(p.relative_to(store.path)) for p in store.path.rglob("*") if p.is_file()}
    assert on_disk - {"windowkit.json"} == {f["path"] for f in info["files"]}
    for entry in info["files"]:
        assert (store.path / entry["path"]).stat().st_size == entry["bytes"]


@pytest.mark.parametrize("compression", ["zstd", "gzip", "none", "lz4"])
def test_compressions(fmt: str, tmp_path: Path, compression: str) -> None:
    series = _numbered_series([100])
    if compression not in get_format(fmt).compressions:
        with pytest.raises(wk.InvalidSpecError, match=f"compression 'lz4' is not valid for {fmt}"):
            wk.convert(series, tmp_path / "s", format=fmt, window=5, compression="lz4")
        assert not (tmp_path / "s").exists() and not list(tmp_path.iterdir())
        return
    store = wk.convert(series, tmp_path / "s", format=fmt, window=5, compression=compression,
                       block_rows=16)
    np.testing.assert_array_equal(store.windows("train", [95])[0], series[0][95:100])


def _data_and_index_bytes(store: wk.Store) -> dict[str, bytes]:
    return {str(p.relative_to(store.path)): p.read_bytes()
            for p in sorted(store.path.rglob("*")) if p.is_file() and p.suffix != ".json"}


def test_parallel_convert_writes_the_same_store(fmt: str, tmp_path: Path) -> None:
    series = _numbered_series([700, 45, 900])
    spec = wk.WindowSpec(6, stride=2, horizon=1)
    one = wk.convert(series, tmp_path / "one", format=fmt, window=spec, block_rows=64,
                     shards=5)
    two = wk.convert(series, tmp_path / "two", format=fmt, window=spec, block_rows=64,
                     shards=5, workers=2)
    assert _data_and_index_bytes(one) == _data_and_index_bytes(two)
    assert one.info["normalization"] == two.info["normalization"]
    assert one.info["data"] == two.info["data"]


def test_parallel_convert_reports_the_first_bad_row(fmt: str, tmp_path: Path) -> None:
    series = _numbered_series([300, 300])
    series[1][123, 1] = np.nan
    with pytest.raises(wk.SourceError, match="series '1': row 123, column 1 is nan"):
        wk.convert(series, tmp_path / "s", format=fmt, window=4, block_rows=32, shards=4,
                   workers=2)
    assert not list(tmp_path.iterdir())


def test_batches_can_be_prefetched_to_a_device(fmt: str, tmp_path: Path) -> None:
    series = _numbered_series([60])
    store = wk.convert(series, tmp_path / "s", format=fmt, window=4)
    x = collect_epoch(store.tf_dataset("train", 8, shuffle=False, device="/CPU:0"))[0]
    np.testing.assert_array_equal(x, oracle_windows(series, store.spec)[0])
    with pytest.raises(wk.InvalidSpecError, match=r"device '/GPU:7' is not available on this "
                                                  r"machine; available: .*CPU:0"):
        store.tf_dataset("train", 8, device="/GPU:7")


def test_tf_dataset_rejects_bad_arguments(fmt: str, tmp_path: Path) -> None:
    store = wk.convert(_numbered_series([40]), tmp_path / "s", format=fmt, window=4)
    with pytest.raises(wk.InvalidSpecError, match="batch_size must be an integer >= 1, got 0"):
        store.tf_dataset("train", 0)
    with pytest.raises(wk.InvalidSpecError, match="shuffle_blocks must be >= 1 or None, got 0"):
        store.tf_dataset("train", 8, shuffle_blocks=0)


def test_shuffle_blocks_bounds_how_far_windows_travel(fmt: str, tmp_path: Path) -> None:
    """With one block per group, each batch's windows come from one or two blocks."""
    rows = np.arange(4096, dtype=np.float32)[:, None]
    store = wk.convert([rows], tmp_path / "s", format=fmt, window=4, block_rows=256)
    starts = collect_epoch(store.tf_dataset("train", 64, shuffle_blocks=1, seed=5))[0][:, 0, 0]
    assert sorted(starts.tolist()) == list(range(4093))
    assert not np.array_equal(starts, np.sort(starts))
    blocks = starts.astype(np.int64) // 256
    assert max(len(np.unique(blocks[i:i + 64])) for i in range(0, len(blocks), 64)) <= 2
