"""What the readers do with any store, on the concept format: shuffled epochs,
batches, normalization, arguments. How each format writes and reads its bytes
(round trips against the NumPy oracle, every dtype, compressions, files) is the
format contract: tests/format_contract.py, run for every format.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import windowkit as wk
from tests.conftest import IMPLEMENTED_FORMATS, collect_epoch, oracle_windows
from tests.helpers import (
    ALL_DTYPES,
    check_normalized,
    dtype_series,
    normalized,
    numbered_series,
)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_every_dtype_normalizes_in_tf_dataset(dtype: str, tmp_path: Path) -> None:
    """``tf_dataset(normalize=True)`` casts every dtype to floats. The cast runs
    after decoding, in the graph both tf readers share, so the dtypes take
    turns over the formats (decoding is checked per format: FormatTests)."""
    fmt = IMPLEMENTED_FORMATS[ALL_DTYPES.index(dtype) % len(IMPLEMENTED_FORMATS)]
    series = dtype_series(dtype)
    spec = wk.WindowSpec(5, stride=2, horizon=1)
    store = wk.convert(series, tmp_path / "s", format=fmt, window=spec, block_rows=16)
    if dtype == "float64":  # extremes: statistics overflow, normalizing is refused
        assert store.manifest.normalization is None
        with pytest.raises(wk.StoreError, match="no normalization statistics"):
            store.tf_dataset("train", 32, normalize=True)
        return
    expected = normalized(store, *oracle_windows(series, spec))
    got = collect_epoch(store.tf_dataset("train", 32, shuffle=False, normalize=True))
    check_normalized(got, expected, dtype)


def test_shuffled_epochs_visit_each_window_once_in_new_orders(concept_format: str,
                                                              tmp_path: Path) -> None:
    series = numbered_series([500, 320, 7, 260])
    spec = wk.WindowSpec(5, stride=2)
    store = wk.convert(series, tmp_path / "s", format=concept_format, window=spec, block_rows=16)
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


def test_small_store_shuffle_mixes_the_whole_split(concept_format: str, tmp_path: Path) -> None:
    """When the cache holds every block, a batch draws from the whole split."""
    series = numbered_series([4000])
    store = wk.convert(series, tmp_path / "s", format=concept_format, window=8, block_rows=64)
    first = next(iter(store.tf_dataset("train", 256, seed=0)))[:, 0, 0].numpy()
    blocks = np.unique(first // 64)
    assert len(blocks) > 40  # of 63 blocks: windows come from all over the split


def test_drop_remainder_gives_static_batch_dimension(concept_format: str, tmp_path: Path) -> None:
    store = wk.convert(numbered_series([100]), tmp_path / "s", format=concept_format,
                       window=wk.WindowSpec(4, horizon=2))
    ds = store.tf_dataset("train", 16, drop_remainder=True)
    x_spec, y_spec = ds.element_spec
    assert tuple(x_spec.shape) == (16, 4, 2) and tuple(y_spec.shape) == (16, 2, 2)
    assert ds.cardinality().numpy() == 95 // 16
    assert sum(1 for _ in ds) == 95 // 16
    loose = store.tf_dataset("train", 16)
    assert tuple(loose.element_spec[0].shape) == (None, 4, 2)
    assert loose.cardinality().numpy() == -(-95 // 16)


def test_normalize_uses_column_statistics(concept_format: str, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    values = rng.normal([10.0, -3.0, 0.0], [2.0, 0.5, 1e-9], size=(2000, 3)).astype(np.float32)
    values[:, 2] = 7.0  # a constant column: shifted, never divided by zero
    store = wk.convert([values], tmp_path / "s", format=concept_format, window=16)
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


def test_normalize_is_per_channel_for_frames(concept_format: str, tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    frames = rng.normal(0, 1, size=(300, 2, 4, 4)).astype(np.float32)
    frames[:, 1] = frames[:, 1] * 5 + 100
    store = wk.convert([frames], tmp_path / "s", format=concept_format, window=wk.WindowSpec(3,
                                                                                             horizon=1))
    assert len(store.info["normalization"]["mean"]) == 2
    x, y = collect_epoch(store.tf_dataset("train", 64, normalize=True))
    assert x.shape[1:] == (3, 2, 4, 4) and y.shape[1:] == (1, 2, 4, 4)
    assert abs(float(x[:, :, 1].mean())) < 0.1 and abs(float(x[:, :, 1].std()) - 1) < 0.1


def test_windows_rejects_positions_out_of_range(concept_format: str, tmp_path: Path) -> None:
    store = wk.convert(numbered_series([20]), tmp_path / "s", format=concept_format, window=5)
    with pytest.raises(IndexError, match="window position 16 is out of range for 16 windows"):
        store.windows("train", [0, 16])
    with pytest.raises(wk.InvalidSpecError, match="split 'val' is not in store"):
        store.windows("val", [0])


def test_parallel_convert_reports_the_first_bad_row(concept_format: str, tmp_path: Path) -> None:
    series = numbered_series([300, 300])
    series[1][123, 1] = np.nan
    with pytest.raises(wk.SourceError, match="series '1': row 123, column 1 is nan"):
        wk.convert(series, tmp_path / "s", format=concept_format, window=4, block_rows=32, parts=4,
                   workers=2)
    assert not list(tmp_path.iterdir())


def test_batches_can_be_prefetched_to_a_device(concept_format: str, tmp_path: Path) -> None:
    series = numbered_series([60])
    store = wk.convert(series, tmp_path / "s", format=concept_format, window=4)
    x = collect_epoch(store.tf_dataset("train", 8, shuffle=False, device="/CPU:0"))[0]
    np.testing.assert_array_equal(x, oracle_windows(series, store.spec)[0])
    with pytest.raises(wk.InvalidSpecError, match=r"device '/GPU:7' is not available on this "
                                                  r"machine; available: .*CPU:0"):
        store.tf_dataset("train", 8, device="/GPU:7")


def test_tf_dataset_rejects_bad_arguments(concept_format: str, tmp_path: Path) -> None:
    store = wk.convert(numbered_series([40]), tmp_path / "s", format=concept_format, window=4)
    with pytest.raises(wk.InvalidSpecError, match="batch_size must be an integer >= 1, got 0"):
        store.tf_dataset("train", 0)
    with pytest.raises(wk.InvalidSpecError, match="shuffle_blocks must be an integer >= 1, got 0"):
        store.tf_dataset("train", 8, shuffle_blocks=0)


