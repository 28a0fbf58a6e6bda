"""The test oracle itself equals keras.utils.timeseries_dataset_from_array per series."""

from __future__ import annotations

import numpy as np
from hypothesis import assume, given
from hypothesis import strategies as st

import windowkit as wk
from tests.conftest import oracle_windows


@given(rows=st.integers(1, 60), features=st.integers(1, 3), length=st.integers(1, 8),
       stride=st.integers(1, 4), rate=st.integers(1, 3))
def test_oracle_matches_keras(rows: int, features: int, length: int, stride: int,
                              rate: int) -> None:
    import keras

    values = np.arange(rows * features, dtype=np.float32).reshape(rows, features)
    spec = wk.WindowSpec(length, stride=stride, sampling_rate=rate)
    expected, _ = oracle_windows([values], spec)
    assume(rate < rows and stride < rows)  # keras refuses data not longer than these
    if (length - 1) * rate + 1 > rows:
        assert len(expected) == 0  # keras raises or yields nothing for too-short data
        return
    ds = keras.utils.timeseries_dataset_from_array(
        values, None, sequence_length=length, sequence_stride=stride, sampling_rate=rate,
        batch_size=1000, shuffle=False)
    got = np.concatenate([b.numpy() for b in ds]) if len(expected) else expected
    np.testing.assert_array_equal(got, expected)
    assert spec.num_windows(rows) == len(expected)
