"""Batches carried across groups of blocks are exactly what ``rebatch`` of the
per-group batches makes: same windows, same order, same batch sizes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import windowkit as wk

tf = pytest.importorskip("tensorflow")


@pytest.mark.parametrize("batch_size", [7, 32, 300])
@pytest.mark.parametrize("drop_remainder", [False, True])
@pytest.mark.parametrize("series", [False, True])
def test_carried_batches_equal_rebatch(tmp_path: Path, batch_size: int,
                                       drop_remainder: bool, series: bool) -> None:
    from windowkit.readers.tf import batch_cutter
    from windowkit.readers.tfdata.carry import carried_batches
    from windowkit.readers.tfdata.cut import WindowCutter
    from windowkit.readers.tfdata.groups import block_groups

    arrays = [np.column_stack([np.full(n, s), np.arange(n)]).astype(np.float32)
              for s, n in enumerate([700, 33, 900, 50, 12, 610])]
    store = wk.convert(arrays, tmp_path / "s", format="zarr",
                       window=wk.WindowSpec(8, horizon=2), block_rows=16,
                       known_columns=["1"], target_columns=["0"])
    plan = store.read_plan("train")
    fields = plan.store.fields(series)

    def groups() -> tf.data.Dataset:  # groups of 1-3 blocks: many hold under a batch
        return block_groups(plan, shuffle=True, seed=3, shuffle_blocks=2, cache_bytes=1 << 20,
                            with_series=fields.series)

    cutter = WindowCutter(plan.spec, None, plan.store.target_positions, fields)
    carried = carried_batches(groups(), cutter, batch_size=batch_size,
                              drop_remainder=drop_remainder,
                              empty_rows=tf.zeros([plan.spec.span, 2]),
                              with_series=fields.series)
    cut = batch_cutter(plan.spec, batch_size, None, plan.store.target_positions, fields)
    rebatched = groups().flat_map(cut).rebatch(batch_size, drop_remainder)
    got, want = list(carried), list(rebatched)
    assert len(got) == len(want) > 0
    for a, b in zip(got, want, strict=True):
        tf.nest.map_structure(lambda u, v: np.testing.assert_array_equal(u.numpy(), v.numpy()),
                              a, b)
    if drop_remainder:
        assert all(s.shape[0] == batch_size for s in tf.nest.flatten(carried.element_spec))
