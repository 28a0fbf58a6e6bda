"""Target columns: ``y`` holds only the chosen columns, ``[H, len(target_columns)]``
(the README's window semantics), while ``x`` keeps every feature, in every format and reader."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

import windowkit as wk
from tests.conftest import assert_windows_equal, collect_epoch, oracle_windows
from windowkit.cli import main

SPEC = wk.WindowSpec(8, stride=3, horizon=4)
FEATURES = ["load", "temp", "price", "wind"]


def _grid() -> pd.DataFrame:
    """Hourly load of three regions, with weather and a price: forecast load and price."""
    rng = np.random.default_rng(11)
    parts = []
    for region, n in [("east", 200), ("west", 150), ("north", 90)]:
        parts.append(pd.DataFrame({
            "region": region, "hour": np.arange(n),
            "load": rng.normal(500, 50, n), "temp": rng.normal(10, 5, n),
            "price": rng.gamma(3, 20, n), "wind": rng.uniform(0, 15, n)}))
    return pd.concat(parts, ignore_index=True)


def _oracle(frame: pd.DataFrame, targets: list[int]) -> tuple[np.ndarray, np.ndarray]:
    series = [g[FEATURES].to_numpy() for _, g in frame.groupby("region", sort=False)]
    x, y = oracle_windows(series, SPEC)
    assert y is not None
    return x, y[:, :, targets]


def test_targets_hold_only_the_target_columns(tmp_path: Path, concept_format: str) -> None:
    frame = _grid()
    frame.to_csv(tmp_path / "grid.csv", index=False)
    result = CliRunner().invoke(main, [
        "convert", str(tmp_path / "grid.csv"), "--format", concept_format,
        "--out", str(tmp_path / "s"),
        "--window", "8", "--stride", "3", "--horizon", "4", "--series-col", "region",
        "--time-col", "hour", "--target-columns", "price,load", "--block-rows", "16", "-q"])
    assert result.exit_code == 0, result.output
    store = wk.open_store(tmp_path / "s")
    want_x, want_y = _oracle(frame, [2, 0])
    assert store.manifest.target_columns == ["price", "load"]
    n = store.num_windows("train")
    x, y = store.windows("train", np.arange(n))
    assert x.shape == (n, 8, 4) and y.shape == (n, 4, 2)
    assert_windows_equal(x, y, want_x, want_y, in_order=True)

    ds = store.tf_dataset("train", 16, seed=3)
    assert ds.element_spec[0].shape.as_list() == [None, 8, 4]
    assert ds.element_spec[1].shape.as_list() == [None, 4, 2]
    tx, ty = collect_epoch(ds)
    assert_windows_equal(tx, ty, want_x, want_y, in_order=False)

    keras = store.keras_dataset("train", 64, seed=3, cache_bytes=1 << 12)  # several passes
    batches = [keras[i] for i in range(len(keras))]
    kx = np.concatenate([b[0] for b in batches])
    ky = np.concatenate([b[1] for b in batches])
    assert_windows_equal(kx, ky, want_x, want_y, in_order=False)

    shown = CliRunner().invoke(main, ["inspect", str(tmp_path / "s")])
    assert "target columns   price, load" in shown.output


def test_normalized_targets_use_their_own_columns_statistics(tmp_path: Path,
                                                             concept_format: str) -> None:
    frame = _grid()
    store = wk.convert(frame, tmp_path / "s", format=concept_format, window=SPEC,
                       series_col="region",
                       time_col="hour", target_columns=["wind"])
    stats = store.manifest.normalization
    assert stats is not None
    mean, std = np.array(stats.mean), np.array(stats.std)
    want_x, want_y = _oracle(frame, [3])
    want_x = (want_x - mean) / std
    want_y = (want_y - mean[3]) / std[3]
    n = store.num_windows("train")
    x, y = store.windows("train", np.arange(n), normalize=True)
    np.testing.assert_allclose(x, want_x, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-5)
    tx, ty = collect_epoch(store.tf_dataset("train", 32, shuffle=False, normalize=True))
    np.testing.assert_allclose(tx, want_x, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ty, want_y, rtol=1e-5, atol=1e-5)
    keras = store.keras_dataset("train", n, shuffle=False, normalize=True)
    kx, ky = keras[0]
    np.testing.assert_allclose(kx, want_x, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ky, want_y, rtol=1e-5, atol=1e-5)


def test_array_sources_name_targets_by_position(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    series = [rng.normal(size=(60, 3)).astype(np.float32), rng.normal(size=(40, 3))
              .astype(np.float32)]
    store = wk.convert(series, tmp_path / "s", format="zarr", window=SPEC, target_columns=["2"])
    assert store.manifest.target_columns == ["f2"]
    x, y = oracle_windows(series, SPEC)
    assert y is not None
    got_x, got_y = store.windows("train", np.arange(store.num_windows("train")))
    assert_windows_equal(got_x, got_y, x, y[:, :, [2]], in_order=True)


def test_keras_fit_on_target_columns(tmp_path: Path) -> None:
    import keras

    store = wk.convert(_grid(), tmp_path / "s", format="parquet", window=SPEC,
                       series_col="region", time_col="hour", target_columns=["load"])
    model = keras.Sequential([keras.Input((8, 4)), keras.layers.Flatten(),
                              keras.layers.Dense(4), keras.layers.Reshape((4, 1))])
    model.compile("adam", "mse")
    history = model.fit(store.tf_dataset("train", 32, normalize=True), epochs=1, verbose=0,
                        shuffle=False)
    assert np.isfinite(history.history["loss"][0])


@pytest.mark.parametrize(("targets", "kwargs", "message"), [
    (["rain"], {}, r"target column 'rain' is not a feature column \(features: load, temp"),
    (["load", "load"], {}, "target columns repeat a column: load, load"),
    (["load"], {"window": wk.WindowSpec(8)}, "target columns need a horizon"),
    (["price"], {"columns": ["load", "temp"]},
     r"target column 'price' is not a feature column \(features: load, temp\)"),
])
def test_bad_target_columns(tmp_path: Path, targets: list[str], kwargs: dict[str, object],
                            message: str) -> None:
    options: dict[str, object] = {"window": SPEC, **kwargs}
    with pytest.raises(wk.InvalidSpecError, match=message):
        wk.convert(_grid(), tmp_path / "s", series_col="region", time_col="hour",
                   target_columns=targets, **options)  # type: ignore[arg-type]
    assert not (tmp_path / "s").exists()
    assert not list(tmp_path.iterdir())


def test_targets_need_vector_rows(tmp_path: Path) -> None:
    frames = np.zeros((30, 2, 4, 4), dtype=np.float32)
    with pytest.raises(wk.InvalidSpecError, match=r"rows have shape \(2, 4, 4\)"):
        wk.convert([frames], tmp_path / "s", window=SPEC, target_columns=["0"])
