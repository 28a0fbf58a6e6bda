"""Tables whose series interleave (a log of several sensors in time order):
read into memory within a budget, and their rows collected series by series (the
word "group" is kept for block groups, the shuffle's unit)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from windowkit._progress import human_size
from windowkit.errors import SourceError


def read_within(batches: Iterable[pa.RecordBatch], needed: list[str] | None, budget: int,
                refusal: SourceError) -> pa.Table:
    """The whole table in memory, if it fits ``budget`` bytes; else ``refusal``,
    saying so."""
    kept, size = [], 0
    for batch in batches:
        if needed:
            batch = batch.select(needed)
        size += batch.nbytes
        if size > budget:
            raise type(refusal)(
                f"{refusal} (the table is larger than the memory budget for sorting it here, "
                f"--sort-memory {human_size(budget)})") from None
        kept.append(batch)
    return pa.Table.from_batches(kept)


def rows_by_series(table: pa.Table, series_col: str, batch_rows: int
                    ) -> tuple[Iterator[pa.RecordBatch], np.ndarray]:
    """The table's rows series by series (series in order of first appearance,
    each series' rows in table order), as record batches taken one at a time
    (one copy of the table, not two), and each grouped row's table row."""
    keys = table.column(series_col).combine_chunks()
    order = pc.sort_indices(pc.dictionary_encode(keys).indices)  # stable: rows keep order
    del keys
    grouped = (batch for lo in range(0, len(order), batch_rows)
               for batch in table.take(order[lo:lo + batch_rows]).to_batches())
    return grouped, order.to_numpy()
