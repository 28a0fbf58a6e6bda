"""One definition of a window: the NumPy cut (Keras reader, random access) and the
graph cut (``tf.data`` readers) give the same windows, the README's."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from hypothesis import given
from hypothesis import strategies as st

import windowkit as wk
from windowkit.readers.tf import batch_cutter
from windowkit.readers.windows import cut_windows


@st.composite
def cuts(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, wk.WindowSpec, np.ndarray | None]:
    spec = wk.WindowSpec(length=draw(st.integers(1, 6)), sampling_rate=draw(st.integers(1, 3)),
                         horizon=draw(st.integers(0, 3)))
    features = draw(st.integers(1, 4))
    rows = draw(st.integers(spec.span, spec.span + 40))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    values = rng.normal(size=(rows, features)).astype(np.float32)
    starts = rng.integers(0, rows - spec.span + 1, size=draw(st.integers(1, 30)))
    targets = None
    if spec.horizon and draw(st.booleans()):
        targets = np.sort(rng.choice(features, size=draw(st.integers(1, features)),
                                     replace=False)).astype(np.int64)
    return values, starts, spec, targets


@given(data=cuts(), batch_size=st.integers(1, 8))
def test_numpy_and_graph_cuts_are_the_same_windows(data: tuple, batch_size: int) -> None:
    rows, starts, spec, targets = data
    x, y = cut_windows(rows, starts, spec, targets)
    L, R, H = spec.length, spec.sampling_rate, spec.horizon  # noqa: N806
    for i, r in enumerate(starts):  # the README's window semantics, one by one
        np.testing.assert_array_equal(x[i], rows[r: r + L * R: R])
        if H:
            expected = rows[r + L * R: r + (L + H) * R: R]
            np.testing.assert_array_equal(y[i], expected if targets is None
                                          else expected[:, targets])
    cut = batch_cutter(spec, batch_size, None, targets)
    batches = list(cut(tf.constant(rows), tf.constant(starts, dtype=tf.int64)))
    graph_x = np.concatenate([(b[0] if H else b).numpy() for b in batches])
    np.testing.assert_array_equal(graph_x, x)
    if H:
        np.testing.assert_array_equal(np.concatenate([b[1].numpy() for b in batches]), y)
