"""The window contract: window ``k`` of a series starts at row ``k * stride`` of that
series; splits (with or without history context) and skipped missing values only
*remove* windows from that grid, so a store's windows are always a subset of
``keras.utils.timeseries_dataset_from_array`` applied per series."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import windowkit as wk
from tests.conftest import collect_epoch


def _expected_starts(n: int, lo: int, hi: int, spec: wk.WindowSpec, nan_rows: set[int],
                     context: str) -> list[int]:
    """The grid windows of a series of ``n`` rows that split rows ``[lo, hi)`` keep."""
    L, H, R = spec.length, spec.horizon, spec.sampling_rate  # noqa: N806
    out = []
    for s in range(0, n - (L + H - 1) * R, spec.stride):  # Keras' windows of the series
        last = s + spec.span  # one past the window's last row
        if context == "history" and H:
            inside = s + L * R >= lo and last <= hi  # every target in the split
        else:
            inside = s >= lo and last <= hi
        if inside and not nan_rows & set(range(s, last)):
            out.append(s)
    return out


def _series(lengths: list[int], nans: list[int], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = [rng.normal(size=(n, 2)).astype(np.float32) for n in lengths]
    for k, row in enumerate(nans):
        values = arrays[k % len(arrays)]
        values[row % len(values), k % 2] = np.nan
    return arrays


def _check_store(store: wk.Store, arrays: list[np.ndarray], spec: wk.WindowSpec,
                 fractions: dict[str, float], context: str) -> None:
    cuts = np.cumsum([0.0, *fractions.values()])
    for k, split in enumerate(fractions):
        index = store.index(split) if store.num_windows(split) else np.empty((0, 3), np.int64)
        for sid, values in enumerate(arrays):
            n = len(values)
            lo, hi = (int(v) for v in np.rint(n * cuts[k:k + 2]))
            nan_rows = set(np.flatnonzero(np.isnan(values).any(axis=1)).tolist())
            want = _expected_starts(n, lo, hi, spec, nan_rows, context) if hi > lo else []
            got = index[index[:, 0] == sid, 1].tolist()
            assert got == want, (split, sid, lo, hi)
        if len(index):
            R, L, H = spec.sampling_rate, spec.length, spec.horizon  # noqa: N806
            got = store.windows(split, np.arange(len(index)))
            x = got[0] if isinstance(got, tuple) else got
            for i, (sid, start, _) in enumerate(index.tolist()):
                np.testing.assert_array_equal(x[i], arrays[sid][start:start + L * R:R])
                if H:
                    np.testing.assert_array_equal(
                        got[1][i], arrays[sid][start + L * R:start + (L + H) * R:R])


@settings(max_examples=30, deadline=None)
@given(length=st.integers(1, 5), stride=st.integers(1, 4), rate=st.integers(1, 3),
       horizon=st.integers(0, 3), lengths=st.lists(st.integers(8, 70), min_size=1, max_size=3),
       nans=st.lists(st.integers(0, 69), max_size=4), train=st.sampled_from([0.5, 0.7, 0.85]),
       context=st.sampled_from(["none", "history"]), seed=st.integers(0, 9))
def test_windows_stay_on_the_series_grid(tmp_path_factory: pytest.TempPathFactory, length: int,
                                         stride: int, rate: int, horizon: int,
                                         lengths: list[int], nans: list[int], train: float,
                                         context: str, seed: int) -> None:
    spec = wk.WindowSpec(length, stride=stride, sampling_rate=rate, horizon=horizon)
    arrays = _series(lengths, nans, seed)
    fractions = {"train": train, "val": round(1 - train, 6)}
    out = tmp_path_factory.mktemp("contract") / "store"
    try:
        store = wk.convert(arrays, out, format="zarr", window=spec, splits=fractions,
                           split_context=context, nan="skip", block_rows=16)
    except wk.WindowkitError:
        # only a conversion that would hold no window at all may refuse
        cuts = np.cumsum([0.0, *fractions.values()])
        total = 0
        for values in arrays:
            nan_rows = set(np.flatnonzero(np.isnan(values).any(axis=1)).tolist())
            for k in range(2):
                lo, hi = (int(v) for v in np.rint(len(values) * cuts[k:k + 2]))
                total += len(_expected_starts(len(values), lo, hi, spec, nan_rows, context))
        assert total == 0
        return
    _check_store(store, arrays, spec, fractions, context)


@pytest.mark.parametrize("context", ["none", "history"])
def test_every_format_and_reader_keeps_the_grid(tmp_path: Path, fmt: str, context: str) -> None:
    """Stride 3 with splits and missing values: both readers give the grid's windows."""
    spec = wk.WindowSpec(4, stride=3, horizon=2)
    arrays = _series([90, 61, 47], [5, 33, 40, 12], seed=3)
    fractions = {"train": 0.7, "val": 0.3}
    store = wk.convert(arrays, tmp_path / "s", format=fmt, window=spec, splits=fractions,
                       split_context=context, nan="skip", block_rows=16)
    _check_store(store, arrays, spec, fractions, context)
    for split in fractions:
        want = store.windows(split, np.arange(store.num_windows(split)))
        x, y = collect_epoch(store.tf_dataset(split, 8, shuffle=False))
        np.testing.assert_array_equal(x, want[0])
        np.testing.assert_array_equal(y, want[1])
        seq = store.keras_dataset(split, 8, shuffle=False)
        batches = [seq[i] for i in range(len(seq))]
        np.testing.assert_array_equal(np.concatenate([b[0] for b in batches]), want[0])
        np.testing.assert_array_equal(np.concatenate([b[1] for b in batches]), want[1])
