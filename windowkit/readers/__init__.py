"""Reading a store's windows.

What a reader needs is a read plan (:class:`ReadPlan`, built by
:meth:`windowkit.Store.read_plan`); the readers themselves are
:mod:`windowkit.readers.tf` (``tf.data``) and :mod:`windowkit.readers.keras`
(a ``keras.utils.PyDataset``), imported when used since they load TensorFlow
or Keras. This package also holds what both use: the epoch order and the
block pool that cuts windows from decoded blocks.
"""

import numpy as np

from windowkit.errors import InvalidSpecError
from windowkit.permutation import index_shuffle
from windowkit.readers._gather import DEFAULT_CACHE_BYTES, BlockPool, WindowGather
from windowkit.readers._order import EpochOrder, WindowOrder, block_first_positions, num_batches
from windowkit.readers.plan import ReadPlan, StoreRows

DEFAULT_MEMORY_BUDGET = 4 << 30  # bytes of rows shuffle="global" may hold in memory


def check_shuffle(shuffle: object) -> bool | str:
    """``shuffle`` if it is one of ``True``, ``False``, ``"global"``; else one line."""
    if isinstance(shuffle, bool | np.bool_):
        return bool(shuffle)
    if isinstance(shuffle, str) and shuffle == "global":
        return "global"
    raise InvalidSpecError(f"shuffle must be True (block groups), False or 'global', got "
                           f"{shuffle!r}")


__all__ = [
    "DEFAULT_CACHE_BYTES",
    "DEFAULT_MEMORY_BUDGET",
    "BlockPool",
    "EpochOrder",
    "ReadPlan",
    "StoreRows",
    "WindowGather",
    "WindowOrder",
    "block_first_positions",
    "check_shuffle",
    "index_shuffle",
    "num_batches",
]
