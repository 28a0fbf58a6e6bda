"""Reading a store's windows.

What a reader needs is a read plan (:class:`ReadPlan`, built by
:meth:`windowkit.Store.read_plan`); the readers themselves are
:mod:`windowkit.readers.tf` (``tf.data``) and :mod:`windowkit.readers.keras`
(a ``keras.utils.PyDataset``), imported when used since they load TensorFlow
or Keras. This package also holds what both use: the epoch order and the
block pool that cuts windows from decoded blocks.
"""

from windowkit.permutation import index_shuffle
from windowkit.readers.numpy_engine.order import (
    EpochOrder,
    WindowOrder,
    block_first_positions,
    num_batches,
)
from windowkit.readers.numpy_engine.pool import DEFAULT_CACHE_BYTES, BlockPool, WindowGather
from windowkit.readers.options import (
    BatchOptions,
    ShardOptions,
    ShuffleOptions,
    check_budget,
    check_shuffle,
    default_memory_budget,
)
from windowkit.readers.plan import ReadPlan, StoreAccess

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
