"""Reading a store's windows.

What a reader needs is a read plan (:class:`ReadPlan`, built by
:meth:`windowkit.Store.read_plan`). The epoch, the same for every reader,
is in :mod:`windowkit.readers.epoch`; a split's rows in
:mod:`windowkit.readers.rows`; each framework's delivery in its own module:
:mod:`windowkit.readers.tf` (``tf.data``), :mod:`windowkit.readers.keras`
(a ``keras.utils.PyDataset``), :mod:`windowkit.readers.torch` and
:mod:`windowkit.readers.grain`, whose reader methods :class:`windowkit.Store`
takes; the frameworks are imported when a reader is built.
"""

from windowkit.readers.epoch.order import (
    EpochOrder,
    WindowOrder,
    block_first_positions,
    num_batches,
)
from windowkit.readers.epoch.permutation import index_shuffle
from windowkit.readers.options import (
    BatchOptions,
    ShardOptions,
    ShuffleOptions,
    check_budget,
    check_shuffle,
    default_memory_budget,
)
from windowkit.readers.plan import ReadPlan, StoreAccess
from windowkit.readers.rows.pool import DEFAULT_CACHE_BYTES, BlockPool, WindowGather

__all__ = [
    "DEFAULT_CACHE_BYTES",
    "BatchOptions",
    "BlockPool",
    "EpochOrder",
    "ReadPlan",
    "ShardOptions",
    "ShuffleOptions",
    "StoreAccess",
    "WindowGather",
    "WindowOrder",
    "block_first_positions",
    "check_budget",
    "check_shuffle",
    "default_memory_budget",
    "index_shuffle",
    "num_batches",
]
