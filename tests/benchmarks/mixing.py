"""How well block groups mix an epoch, by group size: what rounding default
groups down to a power of two blocks costs.

For one epoch's order of a 4M-window split (20 series of 200k rows, blocks of
8192 rows), each batch's mean window position is compared with a uniform
shuffle's: the spread of batch means over the epoch as a multiple of a
uniform order's (1.0: as uniform; larger: batches hold windows from fewer
places of the split), and the distinct blocks a batch draws from. Orders
only: nothing is read but the store's index.

    python -m tests.benchmarks.mixing
"""

from __future__ import annotations

import tempfile

import numpy as np

import windowkit as wk
from windowkit.readers.epoch.batches import EpochBatches
from windowkit.readers.options import BatchOptions, ShuffleOptions
from windowkit.readers.plan import ReadPlan

BATCH, BLOCK_ROWS = 256, 8192


def mixing(plan: ReadPlan, shuffle: str, group: int | None) -> tuple[str, float, float]:
    """The order's name, its batch-mean spread over a uniform order's, and
    the distinct blocks a batch draws from (first 200 batches)."""
    batches = EpochBatches(plan, BatchOptions.checked(BATCH),
                           ShuffleOptions.checked(shuffle, seed=3, memory_budget=1 << 34,
                                                  shuffle_blocks=group))
    local = batches._process_local()
    count = batches.windows_per_epoch // BATCH * BATCH
    where = batches._sequence(local, 0).positions(0, np.arange(count)).reshape(-1, BATCH)
    spread = where.mean(axis=1).std() / (where.std() / np.sqrt(BATCH))
    distinct = np.mean([len(np.unique(row // BLOCK_ROWS)) for row in where[:200]])
    return batches.epoch_order, float(spread), float(distinct)


def main() -> None:
    rng = np.random.default_rng(0)
    series = [rng.standard_normal((200_000, 2), dtype=np.float32) for _ in range(20)]
    with tempfile.TemporaryDirectory() as work:
        store = wk.convert(series, f"{work}/s", format="zarr", window=wk.WindowSpec(32),
                           block_rows=BLOCK_ROWS)
        plan = store.read_plan("train")
        print(f"{store.num_windows('train')} windows, blocks of {BLOCK_ROWS} rows, "
              f"batch {BATCH}")
        for shuffle, group in [*(("blocks", g) for g in (1, 2, 3, 4, 5, 6, 7, 8, 16, 32)),
                               ("global", None)]:
            order, spread, distinct = mixing(plan, shuffle, group)
            print(f"{order:10s} batch-mean spread {spread:6.2f}x a uniform order's, "
                  f"{distinct:6.1f} distinct blocks a batch")


if __name__ == "__main__":
    main()
