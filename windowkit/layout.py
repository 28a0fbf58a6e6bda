"""The one model of a store's stored rows: their type, shape, count and blocks.

Every part of windowkit that lays rows out or reads them (a format's writer
and reader, the conversion plan, a read plan, ``bench``) describes the rows
with a :class:`RowLayout` and asks it the derived sizes, so that a row's bytes
or a block's rows are computed in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RowLayout:
    """``total_rows`` rows of ``dtype``, each of ``step_shape``, stored in
    blocks of ``block_rows`` rows (a chunk, a record, a row group: the unit a
    format reads and checks at once). Global rows concatenate every series."""

    dtype: np.dtype
    step_shape: tuple[int, ...]
    total_rows: int
    block_rows: int

    @property
    def cells(self) -> int:
        """Values in one row."""
        return int(np.prod(self.step_shape, dtype=np.int64))

    @property
    def row_bytes(self) -> int:
        """Bytes of one row (at least 1, so that sizes divide by it)."""
        return max(1, self.dtype.itemsize * self.cells)

    @property
    def raw_bytes(self) -> int:
        """Bytes of all rows, uncompressed."""
        return self.total_rows * self.dtype.itemsize * self.cells

    @property
    def num_blocks(self) -> int:
        return -(-self.total_rows // self.block_rows)

    def block_range(self, block: int) -> tuple[int, int]:
        """The global rows ``[start, stop)`` of storage block ``block``."""
        start = block * self.block_rows
        return start, min(start + self.block_rows, self.total_rows)
