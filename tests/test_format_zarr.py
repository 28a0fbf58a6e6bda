"""Zarr stores: the format contract (tests/format_contract.py). What only Zarr
promises about its chunks is checked in tests/test_block_checks.py."""

from __future__ import annotations

from tests.format_contract import FormatTests


class TestZarr(FormatTests):
    """The format contract for Zarr stores."""

    format_name = "zarr"
