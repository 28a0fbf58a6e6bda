"""Forecasting inputs in every format and reader: known-future covariates, the
series id, and dict batches (``inputs``, ``future_known``, ``series``) equal to
the rows they come from; each part normalized with its own columns; a Keras
functional model with inputs named like the keys fits directly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

import windowkit as wk
from windowkit.cli import main

SPEC = wk.WindowSpec(6, stride=2, horizon=3)
KNOWN, TARGETS = [1, 3], [2]


def _tagged(lengths: list[int]) -> list[np.ndarray]:
    """Feature 0: the series; 1: the row (a calendar, known ahead); 2, 3: values."""
    rng = np.random.default_rng(4)
    return [np.column_stack([np.full(n, s), np.arange(n), rng.normal(size=n),
                             rng.normal(size=n)]).astype(np.float32)
            for s, n in enumerate(lengths)]


@pytest.fixture
def arrays() -> list[np.ndarray]:
    return _tagged([300, 41, 222, 9, 160])


@pytest.fixture
def store(tmp_path: Path, concept_format: str, arrays: list[np.ndarray]) -> wk.Store:
    return wk.convert(arrays, tmp_path / "s", format=concept_format, window=SPEC, block_rows=64,
                      known_columns=[str(k) for k in KNOWN],
                      target_columns=[str(t) for t in TARGETS])


def _batches(store: wk.Store, reader: str, **kwargs: Any) -> list[tuple[dict[str, Any], Any]]:
    if reader == "keras":
        ds = store.keras_dataset("train", 32, **kwargs)
        return [ds[i] for i in range(len(ds))]
    shuffle = {"blocks": True, "global": "global", "none": False}[reader]
    return [({k: v.numpy() for k, v in x.items()}, y.numpy())
            for x, y in store.tf_dataset("train", 32, shuffle=shuffle, **kwargs)]


def _check_parts(x: dict[str, np.ndarray], y: np.ndarray, arrays: list[np.ndarray]) -> None:
    """Every part of every window equals the rows it comes from."""
    for i in range(len(y)):
        s, r = int(x["inputs"][i, 0, 0]), int(x["inputs"][i, 0, 1])
        rows = arrays[s]
        np.testing.assert_array_equal(x["inputs"][i], rows[r:r + 6])
        np.testing.assert_array_equal(x["future_known"][i], rows[r + 6:r + 9][:, KNOWN])
        np.testing.assert_array_equal(y[i], rows[r + 6:r + 9][:, TARGETS])
        assert x["series"][i] == s


@pytest.mark.parametrize("reader", ["blocks", "global", "none", "keras"])
def test_dict_batches_hold_each_window_once_with_its_parts(store: wk.Store,
                                                           arrays: list[np.ndarray],
                                                           reader: str) -> None:
    batches = _batches(store, reader, return_series=True)
    for x, y in batches:
        assert set(x) == {"inputs", "future_known", "series"}
        assert x["series"].dtype == np.int32 and x["future_known"].shape[1:] == (3, 2)
        _check_parts(x, y, arrays)
    firsts = sorted(tuple(b) for x, _ in batches for b in x["inputs"][:, 0, :2].tolist())
    want = sorted(tuple(w) for w in store.windows("train", np.arange(
        store.num_windows("train")))[0]["inputs"][:, 0, :2].tolist())
    assert firsts == want


def test_random_access_and_keys_present_only_when_configured(tmp_path: Path,
                                                             store: wk.Store,
                                                             arrays: list[np.ndarray]) -> None:
    x, y = store.windows("train", [0, 5, 40], return_series=True)
    _check_parts(x, y, arrays)
    x, _ = store.windows("train", [0, 5])
    assert set(x) == {"inputs", "future_known"}  # no series unless asked
    plain = wk.convert(arrays, tmp_path / "plain", format=store.manifest.format, window=SPEC)
    x, y = plain.windows("train", [0, 1])
    assert isinstance(x, np.ndarray) and isinstance(y, np.ndarray)  # as before
    x = plain.windows("train", [0, 1], return_series=True)[0]
    assert set(x) == {"inputs", "series"}


@pytest.mark.parametrize(("known", "targets"), [
    ([2, 3], [1]),  # targets then known: one run of columns
    ([3], None),  # every column a target, one of them also known ahead
    ([0], [3, 2]),  # targets out of order, known before them
])
@pytest.mark.parametrize("reader", ["blocks", "global", "keras"])
def test_every_layout_of_target_and_known_columns(tmp_path: Path, concept_format: str,
                                                  arrays: list[np.ndarray], reader: str,
                                                  known: list[int],
                                                  targets: list[int] | None) -> None:
    store = wk.convert(arrays, tmp_path / "s", format=concept_format, window=SPEC, block_rows=64,
                       known_columns=[str(k) for k in known],
                       target_columns=None if targets is None else [str(t) for t in targets])
    y_columns = list(range(4)) if targets is None else targets
    seen = 0
    for x, y in _batches(store, reader):
        for i in range(len(y)):
            rows = arrays[int(x["inputs"][i, 0, 0])]
            r = int(x["inputs"][i, 0, 1])
            np.testing.assert_array_equal(x["future_known"][i], rows[r + 6:r + 9][:, known])
            np.testing.assert_array_equal(y[i], rows[r + 6:r + 9][:, y_columns])
        seen += len(y)
    assert seen == store.num_windows("train")


@pytest.mark.parametrize("reader", ["blocks", "global", "keras"])
def test_each_part_is_normalized_with_its_own_columns(store: wk.Store, reader: str) -> None:
    stats = store.manifest.normalization
    mean, std = np.array(stats.mean), np.array(stats.std)
    raw = {tuple(x["inputs"][i, 0, :2]): (x, y, i)
           for x, y in _batches(store, reader, return_series=True) for i in range(len(y))}
    for x, y in _batches(store, reader, return_series=True, normalize=True):
        for i in range(len(y)):
            key = tuple(x["inputs"][i, 0, :2] * std[:2] + mean[:2])
            rx, ry, j = raw[min(raw, key=lambda k: abs(k[0] - key[0]) + abs(k[1] - key[1]))]
            np.testing.assert_allclose(x["inputs"][i], (rx["inputs"][j] - mean) / std,
                                       rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(x["future_known"][i],
                                       (rx["future_known"][j] - mean[KNOWN]) / std[KNOWN],
                                       rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(y[i], (ry[j] - mean[TARGETS]) / std[TARGETS],
                                       rtol=1e-5, atol=1e-5)
            assert x["series"][i] == rx["series"][j]
        break


@pytest.mark.parametrize("reader", ["tf", "keras"])
def test_a_functional_model_with_named_inputs_fits(store: wk.Store, reader: str) -> None:
    """A DeepAR-style model: a series embedding, the inputs, the known future."""
    import keras

    inputs = keras.Input((6, 4), name="inputs")
    known = keras.Input((3, 2), name="future_known")
    series = keras.Input((), name="series", dtype="int32")
    embedded = keras.layers.Embedding(5, 4)(series)
    context = keras.layers.Concatenate()([keras.layers.Flatten()(inputs),
                                          keras.layers.Flatten()(known), embedded])
    out = keras.layers.Reshape((3, 1))(keras.layers.Dense(3)(context))
    model = keras.Model({"inputs": inputs, "future_known": known, "series": series}, out)
    model.compile("adam", "mse")
    data = (store.tf_dataset("train", 32, normalize=True, return_series=True) if reader == "tf"
            else store.keras_dataset("train", 32, normalize=True, return_series=True))
    history = model.fit(data, epochs=2, verbose=0, shuffle=False)
    assert np.isfinite(history.history["loss"]).all()


@pytest.mark.parametrize(("args", "message"), [
    (["--known-columns", "f1"], "known columns need a horizon"),
    (["--horizon", "2", "--known-columns", "nope"], "known column 'nope' is not a feature"),
    (["--horizon", "2", "--known-columns", "f1,f1"], "known columns repeat a column"),
])
def test_bad_known_columns_are_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    np.save(tmp_path / "a.npy", np.zeros((50, 3), np.float32))
    out = tmp_path / "store"
    result = CliRunner().invoke(main, ["convert", str(tmp_path / "a.npy"), "--out", str(out),
                                       "--format", "zarr", "--window", "4", "-q", *args])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert message in result.output and not out.exists()


def test_a_text_column_is_not_a_known_column(tmp_path: Path) -> None:
    csv = tmp_path / "t.csv"
    csv.write_text("day,load,kind\n" + "".join(f"{i},{i * 0.5},x\n" for i in range(40)))
    out = tmp_path / "store"
    result = CliRunner().invoke(main, ["convert", str(csv), "--out", str(out), "--window", "4",
                                       "--format", "parquet",
                                       "--horizon", "1", "--columns", "day,load",
                                       "--known-columns", "kind", "-q"])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert "known column 'kind' is not a feature column (features: day, load)" in result.output
    assert not out.exists()


# -- static features ------------------------------------------------------------------------
def _panel(tmp_path: Path) -> tuple[Path, Any]:
    """A long CSV of 4 shops: day, sales, price, and two static columns."""
    import pandas as pd

    rng = np.random.default_rng(2)
    frames = [pd.DataFrame({"shop": f"s{k}", "day": np.arange(n), "sales": rng.normal(size=n),
                            "price": rng.normal(size=n), "size": 10.0 * (k + 1),
                            "region": k % 2, "label": f"shop {k}"})
              for k, n in enumerate([60, 45, 80, 33])]
    frame = pd.concat(frames, ignore_index=True)
    path = tmp_path / "panel.csv"
    frame.to_csv(path, index=False)
    return path, frame


def test_static_columns_of_a_table_reach_every_reader(tmp_path: Path, concept_format: str) -> None:
    path, _frame = _panel(tmp_path)
    store = wk.convert(path, tmp_path / "s", format=concept_format, series_col="shop",
                       time_col="day",
                       columns=["sales", "price"], static_columns=["size", "region"],
                       window=wk.WindowSpec(5, horizon=2),
                       target_columns=["sales"], splits="train=0.7,val=0.3", block_rows=32)
    assert store.manifest.columns == ["sales", "price"]  # static columns are not features
    want = np.array([[10.0 * (k + 1), k % 2] for k in range(4)])
    np.testing.assert_array_equal(store.static_values, want)
    import pyarrow.parquet as pq

    table = pq.read_table(store.path / "series.parquet")
    np.testing.assert_array_equal(table.column("static_size").to_numpy(), want[:, 0])
    batches = ([(x, y) for x, y in store.tf_dataset("train", 16, shuffle="global")]
               + [store.keras_dataset("train", 16)[0]]
               + [store.windows("train", np.arange(store.num_windows("train")))])
    for x, _y in batches:
        x = {k: np.asarray(v) for k, v in x.items()}
        assert set(x) == {"inputs", "static", "series"} and x["inputs"].shape[2] == 2
        np.testing.assert_array_equal(x["static"], want[x["series"]].astype(np.float32))
    # normalized with the statistics of the series that have training rows (all 4 here)
    x, _ = store.windows("train", [0, 100], normalize=True)
    np.testing.assert_allclose(x["static"], (want[x["series"]] - want.mean(0)) / want.std(0),
                               rtol=1e-6)


def test_static_features_of_arrays(tmp_path: Path, concept_format: str) -> None:
    arrays = _tagged([50, 30, 70])
    store = wk.convert(arrays, tmp_path / "s", format=concept_format, window=wk.WindowSpec(4,
                                                                                           horizon=1),
                       static={"area": [1.5, 2.5, 3.5], "kind": [0, 1, 1]})
    assert store.manifest.static_columns == ["area", "kind"]
    x, _y = store.windows("train", np.arange(store.num_windows("train")))
    np.testing.assert_array_equal(x["series"], x["inputs"][:, 0, 0].astype(int))
    np.testing.assert_array_equal(x["static"][:, 0], np.array([1.5, 2.5, 3.5])[x["series"]])


@pytest.mark.parametrize(("value", "message"), [
    (None, "static feature 'area' of series 1 is nan \\(missing or not finite\\)"),
    ("big", "static features are not numbers"),
])
def test_a_damaged_static_feature_is_one_store_error(tmp_path: Path, value: Any,
                                                     message: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    store = wk.convert(_tagged([50, 30, 70]), tmp_path / "s", format="zarr",
                       window=wk.WindowSpec(4, horizon=1), static={"area": [1.5, 2.5, 3.5]})
    path = store.path / "series.parquet"
    table = pq.read_table(path)
    column = table.column_names.index("static_area")
    values = pa.array([1.5, value, 3.5]) if value is None else pa.array(["1.5", value, "3.5"])
    pq.write_table(table.set_column(column, "static_area", values), path)
    with pytest.raises(wk.StoreError, match=message):
        wk.open_store(store.path).windows("train", [0])


@pytest.mark.parametrize(("extra", "message"), [
    (["--static-columns", "price", "--columns", "sales"], "static column 'price': "),
    (["--static-columns", "nope"], "no static column 'nope'"),
    (["--static-columns", "shop"], "static column 'shop' is also the series column"),
    (["--static-columns", "label", "--columns", "sales"],
     "static column 'label' is not numeric (string)"),
    (["--static-columns", "size", "--horizon", "1", "--target-columns", "size"],
     "target column 'size' is a static column"),
    (["--static-columns", "size", "--columns", "sales,size"],
     "static column 'size' is also a feature column"),
])
def test_bad_static_columns_are_one_line(tmp_path: Path, extra: list[str],
                                         message: str) -> None:
    path, _frame = _panel(tmp_path)
    out = tmp_path / "store"
    result = CliRunner().invoke(main, ["convert", str(path), "--out", str(out), "--format",
                                       "zarr", "--series-col", "shop", "--time-col", "day",
                                       "--columns", "sales,price", "--window", "4", "-q",
                                       *extra])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert message in result.output and not out.exists()


def test_a_static_column_that_changes_names_series_row_and_column(tmp_path: Path) -> None:
    path, frame = _panel(tmp_path)
    frame.loc[70, "size"] = 99.0  # row 70: the second shop's 11th row
    frame.to_csv(path, index=False)
    out = tmp_path / "store"
    result = CliRunner().invoke(main, ["convert", str(path), "--out", str(out), "--format",
                                       "parquet", "--series-col", "shop", "--time-col", "day",
                                       "--static-columns", "size", "--columns", "sales,price",
                                       "--window", "4", "-q"])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert ("series 's1', row 70, static column 'size': 99 differs from the series' 20"
            in result.output) and not out.exists()


@pytest.mark.parametrize(("static", "message"), [
    ({"area": [1.0, 2.0]}, "static 'area' holds 2 values; there are 3 series"),
    ({"area": ["a", "b", "c"]}, "static 'area': the values are not numbers"),
    ({"area": [1.0, float("nan"), 2.0]}, "static 'area': series 1"),
])
def test_bad_static_arrays_are_one_error(tmp_path: Path, static: dict[str, Any],
                                         message: str) -> None:
    with pytest.raises(wk.InvalidSpecError, match=message):
        wk.convert(_tagged([50, 30, 70]), tmp_path / "s", window=4, static=static)
    assert not (tmp_path / "s").exists()
