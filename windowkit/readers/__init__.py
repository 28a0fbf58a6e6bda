"""Reading a store's windows.

What a reader needs is a read plan (:class:`ReadPlan`, built by
:meth:`windowkit.Store.read_plan`); the readers themselves are
:mod:`windowkit.readers.tf` (``tf.data``) and :mod:`windowkit.readers.keras`
(a ``keras.utils.PyDataset``), imported when used since they load TensorFlow
or Keras. This package also holds what both use: the epoch order and the
block pool that cuts windows from decoded blocks.
"""

import numpy as np

from windowkit.errors import InvalidSpecError, check_int
from windowkit.permutation import index_shuffle
from windowkit.readers._gather import DEFAULT_CACHE_BYTES, BlockPool, WindowGather
from windowkit.readers._order import EpochOrder, WindowOrder, block_first_positions, num_batches
from windowkit.readers._random import default_memory_budget
from windowkit.readers.plan import ReadPlan, StoreAccess


def check_shuffle(shuffle: object) -> bool | str:
    """``shuffle`` if it is one of ``True``, ``False``, ``"global"``,
    ``"blocks"``; else one line."""
    if isinstance(shuffle, bool | np.bool_):
        return bool(shuffle)
    if isinstance(shuffle, str) and shuffle in ("global", "blocks"):
        return shuffle
    raise InvalidSpecError(f"shuffle must be True (the best the memory budget allows), "
                           f"'global' (uniform at any size), 'blocks' (block groups) or "
                           f"False (index order), got {shuffle!r}")


def check_budget(name: str, value: object) -> int | None:
    """``value`` (a byte count >= 1) or None (the default); else one line."""
    return None if value is None else check_int(name, value, 1)


__all__ = [
    "DEFAULT_CACHE_BYTES",
    "BlockPool",
    "EpochOrder",
    "ReadPlan",
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
