"""Reading a store's windows.

What a reader needs is a read plan (:class:`ReadPlan`, built by
:meth:`windowkit.Store.read_plan`); the readers themselves are
:mod:`windowkit.readers.tf` (``tf.data``) and :mod:`windowkit.readers.keras`
(a ``keras.utils.PyDataset``), imported when used since they load TensorFlow
or Keras. This package also holds what both use: the epoch order and the
block pool that cuts windows from decoded blocks.
"""

from windowkit.permutation import index_shuffle
from windowkit.readers._gather import DEFAULT_CACHE_BYTES, BlockPool, WindowGather
from windowkit.readers._order import EpochOrder, WindowOrder, block_first_positions, num_batches
from windowkit.readers.plan import ReadPlan, StoreRows

__all__ = ["DEFAULT_CACHE_BYTES", "BlockPool", "EpochOrder", "ReadPlan", "StoreRows",
           "WindowGather", "WindowOrder", "block_first_positions", "index_shuffle",
           "num_batches"]
