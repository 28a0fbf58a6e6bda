"""The committed fixture data is exactly what its script makes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def test_fixture_script_reproduces_committed_files(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("make_fixtures",
                                                  FIXTURES / "make_fixtures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    made = module.make_sensors(tmp_path)
    for name, values in made.items():
        committed = np.load(FIXTURES / "sensors" / f"{name}.npy")
        np.testing.assert_array_equal(committed, values)
        assert (tmp_path / f"{name}.npy").read_bytes() == (
            FIXTURES / "sensors" / f"{name}.npy").read_bytes()
