"""WindowSpec validation and arithmetic."""

from __future__ import annotations

import dataclasses

import pytest

import windowkit as wk


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"length": 0}, "window length must be an integer >= 1, got 0"),
    ({"length": 4, "stride": 0}, "stride must be an integer >= 1, got 0"),
    ({"length": 4, "sampling_rate": -1}, "sampling rate must be an integer >= 1, got -1"),
    ({"length": 4, "horizon": -2}, "horizon must be an integer >= 0, got -2"),
    ({"length": 2.5}, "window length must be an integer >= 1, got 2.5"),
    ({"length": True}, "window length must be an integer >= 1, got True"),
])
def test_invalid_values_say_what_was_expected(kwargs: dict, message: str) -> None:
    with pytest.raises(wk.InvalidSpecError, match=message.replace("(", r"\(")):
        wk.WindowSpec(**kwargs)


def test_invalid_spec_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        wk.WindowSpec(length=-1)


def test_frozen_and_serializable() -> None:
    spec = wk.WindowSpec(8, stride=2, sampling_rate=3, horizon=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.length = 3  # type: ignore[misc]
    assert wk.WindowSpec.from_dict(spec.to_dict()) == spec
    assert spec.span == (8 + 1 - 1) * 3 + 1


@pytest.mark.parametrize(("rows", "expected"), [(0, 0), (5, 0), (6, 0), (7, 1), (8, 1), (9, 2)])
def test_num_windows_counts_starts(rows: int, expected: int) -> None:
    # L=3, H=1, R=2: a window spans 7 rows; stride 2
    assert wk.WindowSpec(3, stride=2, sampling_rate=2, horizon=1).num_windows(rows) == expected
