"""Stores written by the previous release (format version 3, before the
restructuring of the stored-rows model, part names and Parquet column names)
still open, verify and read the same windows as a store written today.

``fixtures/previous-release/v3-<format>`` were written by windowkit at commit
95f1af3 from the arrays :func:`_series` builds (window 8, stride 2, horizon 2,
blocks of 16 rows, splits train 0.75 / val 0.25)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import windowkit as wk
from windowkit.verify import verify_store

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "previous-release"
SPEC = wk.WindowSpec(8, stride=2, horizon=2)


def _series() -> list[np.ndarray]:
    return [np.arange(60 * 3, dtype=np.float32).reshape(60, 3) + 1000 * i for i in range(3)]


@pytest.mark.parametrize("fmt", wk.FORMAT_NAMES)
def test_a_store_of_the_previous_release_reads_as_today(tmp_path: Path, fmt: str) -> None:
    old_path = tmp_path / "old"
    shutil.copytree(FIXTURES / f"v3-{fmt}", old_path)  # opening never writes; a copy anyway
    old = wk.open_store(old_path)
    assert verify_store(old_path) == []
    new = wk.convert(_series(), tmp_path / "new", format=fmt, window=SPEC, block_rows=16,
                     splits={"train": 0.75, "val": 0.25})
    assert old.splits == new.splits == ["train", "val"]
    for split in new.splits:
        positions = np.arange(new.num_windows(split))
        assert old.num_windows(split) == len(positions) > 0
        for got, want in zip(old.windows(split, positions), new.windows(split, positions),
                             strict=True):
            np.testing.assert_array_equal(got, want)
        x_old, y_old = next(iter(old.tf_dataset(split, 64, shuffle=False)))
        x_new, y_new = next(iter(new.tf_dataset(split, 64, shuffle=False)))
        np.testing.assert_array_equal(x_old.numpy(), x_new.numpy())
        np.testing.assert_array_equal(y_old.numpy(), y_new.numpy())
    keras_old = old.keras_dataset("train", 16, seed=3)
    keras_new = new.keras_dataset("train", 16, seed=3)
    np.testing.assert_array_equal(keras_old[0][0], keras_new[0][0])
