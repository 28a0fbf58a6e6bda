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
from tests.conftest import (
    IMPLEMENTED_FORMATS,
    assert_windows_equal,
    collect_epoch,
    oracle_windows,
)
from windowkit.formats import get_format
from windowkit.readers.keras import WindowPyDataset
from windowkit.store import Windows

#: Every dtype a store may hold: each must round-trip bit-exactly through every reader.
ALL_DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
              "float16", "float32", "float64"]
DTYPES = [np.dtype(name) for name in ALL_DTYPES]
STEP_SHAPES = st.sampled_from([(), (1,), (3,), (2, 3, 2)])


def dtype_values(dtype: np.dtype, shape: tuple[int, ...], rng: np.random.Generator, *,
                 extremes: bool = False) -> np.ndarray:
    """Random values of ``dtype``: integers over its whole range, bools, floats
    around 0 (with ``extremes``: any finite bit pattern, so every exponent, and
    first the dtype's edge values: min, max, the tiniest normal and subnormal
    numbers, -0.0). Never NaN or infinity, which convert refuses."""
    if dtype.kind == "b":
        values = rng.integers(0, 2, size=shape).astype(dtype)
        edges = np.array([True, False], dtype=dtype)
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        values = rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
        edges = np.array([info.min, info.max, 0, 1, info.max // 2 + 1], dtype=dtype)
    elif not extremes:
        return rng.normal(0, 100, size=shape).astype(dtype)
    else:
        finfo = np.finfo(dtype)
        bits = np.dtype(f"u{dtype.itemsize}")
        values = rng.integers(0, np.iinfo(bits).max, size=shape, dtype=bits,
                              endpoint=True).view(dtype)
        values = np.where(np.isfinite(values), values, dtype.type(1.5))
        tiny, sub = finfo.tiny, finfo.smallest_subnormal
        edges = np.array([finfo.min, finfo.max, tiny, -tiny, sub, -sub, tiny - sub, -0.0, 0.0,
                          finfo.eps, 1 + finfo.eps, -1.0], dtype=dtype)
    if extremes:
        flat = values.reshape(-1)
        flat[:len(edges)] = edges[:len(flat)]
    return values


@st.composite
def datasets(draw: st.DrawFn) -> tuple[list[np.ndarray], wk.WindowSpec, int]:
    dtype = draw(st.sampled_from(DTYPES))
    step = draw(STEP_SHAPES)
    spec = wk.WindowSpec(length=draw(st.integers(1, 6)), stride=draw(st.integers(1, 3)),
                         sampling_rate=draw(st.integers(1, 3)), horizon=draw(st.integers(0, 3)))
    # at least one series holds a window (else convert refuses: tests/test_bad_input.py)
    lengths = draw(st.lists(st.integers(1, 50), min_size=0, max_size=3))
    lengths.insert(draw(st.integers(0, len(lengths))), draw(st.integers(spec.span, 50)))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    series = [dtype_values(dtype, (n, *step), rng) for n in lengths]
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


def _bits(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values).view(np.uint8)


def _assert_same_bits(got: np.ndarray | None, expected: np.ndarray | None) -> None:
    """Equal bit for bit (so ``-0.0`` differs from ``0.0``), of one dtype and shape."""
    assert got is not None and expected is not None
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_array_equal(_bits(got), _bits(expected))


def _pair(windows: Windows) -> tuple[np.ndarray, np.ndarray | None]:
    """``(x, y)`` of a reader's ``x`` or ``(x, y)`` (``y`` None without a horizon)."""
    return windows if isinstance(windows, tuple) else (windows, None)


def _keras_epoch(ds: WindowPyDataset) -> tuple[np.ndarray, np.ndarray | None]:
    """Batches ``0 .. len-1`` of a keras_dataset, concatenated."""
    batches = [_pair(ds[i]) for i in range(len(ds))]
    ys = [y for _, y in batches if y is not None]
    return np.concatenate([x for x, _ in batches]), (np.concatenate(ys) if ys else None)


def _check_epoch(got: tuple[np.ndarray, np.ndarray | None], expected_x: np.ndarray,
                 expected_y: np.ndarray | None, *, in_order: bool) -> None:
    x, y = got
    assert x.dtype == expected_x.dtype and (y is None) == (expected_y is None)
    if in_order:
        _assert_same_bits(x, expected_x)
        if expected_y is not None:
            _assert_same_bits(y, expected_y)
    else:  # keys are bytes: the multisets are compared bit for bit
        assert_windows_equal(x, y, expected_x, expected_y, in_order=False)


def _dtype_series(dtype: str) -> list[np.ndarray]:
    rng = np.random.default_rng(sum(map(ord, dtype)))
    return [dtype_values(np.dtype(dtype), (60, 2), rng, extremes=True) for _ in range(3)]


def _normalized(store: wk.Store, x: np.ndarray, y: np.ndarray | None
                ) -> tuple[np.ndarray, np.ndarray | None]:
    norm = store.normalizer()
    return norm(x), (norm.select(store.target_index)(y) if y is not None else None)


def _check_normalized(got: tuple[np.ndarray, np.ndarray | None],
                      expected: tuple[np.ndarray, np.ndarray | None], dtype: str) -> None:
    """Normalized windows are float32 (float64 stays float64) and match NumPy's."""
    want = np.dtype(np.float64 if dtype == "float64" else np.float32)
    assert (got[1] is None) == (expected[1] is None)
    for part, expected_part in zip(got, expected, strict=True):
        if expected_part is not None:
            assert part is not None and part.dtype == want
            np.testing.assert_allclose(part, expected_part, rtol=1e-6)


# the statistics of float64 extremes overflow: such a store has none, and
# normalize=True is refused (never NaN)
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_every_dtype_round_trips_bit_exactly(fmt: str, dtype: str, tmp_path: Path) -> None:
    """Extremes of every dtype come back bit for bit from every reader: random
    access, tf_dataset and keras_dataset, in order and shuffled, with and
    without a horizon (each reader sees both orders across the two stores);
    normalized (float) windows come from random access and keras_dataset."""
    series = _dtype_series(dtype)
    for horizon, tf_in_order in ((2, True), (0, False)):
        spec = wk.WindowSpec(5, stride=2, horizon=horizon)
        expected_x, expected_y = oracle_windows(series, spec)
        store = wk.convert(series, tmp_path / f"h{horizon}", format=fmt, window=spec,
                           block_rows=16)
        assert store.dtype == np.dtype(dtype) and store.num_windows("train") == len(expected_x)
        positions = np.arange(len(expected_x))
        got = store.windows("train", positions)
        _check_epoch(_pair(got), expected_x, expected_y, in_order=True)
        ds = store.tf_dataset("train", 32, shuffle=not tf_in_order, seed=1)
        _check_epoch(collect_epoch(ds), expected_x, expected_y, in_order=tf_in_order)
        keras = store.keras_dataset("train", 32, shuffle=tf_in_order, seed=1)
        _check_epoch(_keras_epoch(keras), expected_x, expected_y, in_order=not tf_in_order)
        if store.manifest.normalization is None:
            assert dtype == "float64"
            with pytest.raises(wk.StoreError, match="no normalization statistics"):
                store.windows("train", positions, normalize=True)
            continue
        expected = _normalized(store, expected_x, expected_y)
        got = store.windows("train", positions, normalize=True)
        _check_normalized(_pair(got), expected, dtype)
        keras = store.keras_dataset("train", 32, shuffle=False, normalize=True)
        _check_normalized(_keras_epoch(keras), expected, dtype)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_every_dtype_normalizes_in_tf_dataset(dtype: str, tmp_path: Path) -> None:
    """``tf_dataset(normalize=True)`` casts every dtype to floats. The cast runs
    after decoding, in the graph both tf readers share, so the dtypes take
    turns over the formats (decoding is checked per format above)."""
    fmt = IMPLEMENTED_FORMATS[ALL_DTYPES.index(dtype) % len(IMPLEMENTED_FORMATS)]
    series = _dtype_series(dtype)
    spec = wk.WindowSpec(5, stride=2, horizon=1)
    store = wk.convert(series, tmp_path / "s", format=fmt, window=spec, block_rows=16)
    if dtype == "float64":  # extremes: statistics overflow, normalizing is refused
        assert store.manifest.normalization is None
        with pytest.raises(wk.StoreError, match="no normalization statistics"):
            store.tf_dataset("train", 32, normalize=True)
        return
    expected = _normalized(store, *oracle_windows(series, spec))
    got = collect_epoch(store.tf_dataset("train", 32, shuffle=False, normalize=True))
    _check_normalized(got, expected, dtype)


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
    assert info["format"] == fmt and info["format_version"] == 3
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
                     parts=5)
    two = wk.convert(series, tmp_path / "two", format=fmt, window=spec, block_rows=64,
                     parts=5, workers=2)
    assert _data_and_index_bytes(one) == _data_and_index_bytes(two)
    assert one.info["normalization"] == two.info["normalization"]
    assert one.info["data"] == two.info["data"]


def test_parallel_convert_reports_the_first_bad_row(fmt: str, tmp_path: Path) -> None:
    series = _numbered_series([300, 300])
    series[1][123, 1] = np.nan
    with pytest.raises(wk.SourceError, match="series '1': row 123, column 1 is nan"):
        wk.convert(series, tmp_path / "s", format=fmt, window=4, block_rows=32, parts=4,
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
    with pytest.raises(wk.InvalidSpecError, match="shuffle_blocks must be an integer >= 1, got 0"):
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
