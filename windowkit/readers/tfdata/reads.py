"""How block groups read their rows: in the ``tf.data`` graph where the
store's format can, else through the format's Python row reader.

- :class:`GraphReads`: TensorFlow's own ops (a local, uncompressed TFRecord
  store: :class:`windowkit.formats.tfrecord_graph.RecordBlocks`): each
  group's records read by ranged ``TFRecordDataset`` reads under a parallel
  ``interleave`` (a dataset of the group, collected in the pipeline's map
  function), then parsed, checked and decoded, and every block checked
  against its digest
  (:class:`windowkit.readers.tfdata.digests.GroupDigests`), with no
  Python per group;
- :class:`NumpyReads`: one stateless ``numpy_function`` call per group, the
  row reader's (:class:`windowkit.readers.rows.loader.GroupLoader`:
  neighbouring blocks as one range, checksums and digests checked): every
  other store (Zarr, Parquet, GZIP TFRecord parts, object storage), and any
  store when asked (``graph_reads=False``, to compare the two).

Either way a group's ``(rows, offsets)``: block ``blocks[i]`` from
``rows[offsets[i]]`` on, followed by the rows its windows reach past it. The
groups, and so the batches, are the same.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from windowkit.formats import _checks
from windowkit.formats._checks import CheckedReader
from windowkit.formats.base import ReadsInGraph
from windowkit.guard import MANIFEST_NAME
from windowkit.location import is_remote
from windowkit.readers.rows.loader import GroupLoader
from windowkit.readers.tfdata.digests import GroupDigests

if TYPE_CHECKING:
    import tensorflow as tf

    from windowkit.readers.plan import ReadPlan


class NumpyReads:
    """Groups read by the format's row reader, one stateless ``numpy_function``
    call per group."""

    def __init__(self, plan: ReadPlan) -> None:
        self._loader = GroupLoader.of(plan)
        self._dtype, self._step_shape = plan.layout.dtype, plan.layout.step_shape

    def rows(self, blocks: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        import tensorflow as tf

        # stateless: the rows depend only on the block ids (the loader's caches
        # never change them); a stateful op makes symbolic checkpointing log a
        # FAILED_PRECONDITION warning at every group
        rows, offsets = tf.numpy_function(self._loader, [blocks],
                                          [tf.as_dtype(self._dtype), tf.int64], stateful=False)
        return tf.ensure_shape(rows, [None, *self._step_shape]), tf.ensure_shape(offsets, [None])


class GraphReads:
    """Groups read by TensorFlow's own ops: a group's records fetched by a
    dataset of its own (collected with ``get_single_element``), then checked
    and decoded.

    Symbolic checkpoints pass the fetch by (what it returns depends only on
    the block ids, as the NumPy path's stateless ``numpy_function``), but
    ``tf.data`` names the collecting op at every group in a C++ warning
    (``FAILED_PRECONDITION: DatasetToSingleElement is stateful``; hidden at
    windowkit's default ``TF_CPP_MIN_LOG_LEVEL``). The alternative, a dataset
    of the group inside the pipeline (``flat_map``), would be state the
    checkpoints hold, which they cannot (``ignore_errors``)."""

    def __init__(self, records: Any, digests: GroupDigests | None) -> None:
        self._records, self._digests = records, digests

    @classmethod
    def of(cls, plan: ReadPlan, blocks: np.ndarray) -> GraphReads | None:
        """The graph reads of the plan's store, for groups of ``blocks``; None
        where its format has none, its parts are compressed, the store is on
        object storage (ranged reads there are requests: the NumPy path), or
        its rows come from elsewhere than its files (a stand-in's row reader,
        as ``windowkit bench``'s, not the format's checked one)."""
        storage = plan.store.storage
        if not isinstance(storage, ReadsInGraph) or is_remote(plan.store.path):
            return None
        rows = plan.store.row_reader()
        if not isinstance(rows, CheckedReader):
            return None
        reader = storage.open_graph_reader(plan.store.path / "data", plan.store.data,
                                           plan.store.reader_setup())
        if not reader.reads_blocks:
            return None
        records = reader.blocks(plan.store.guard.root / MANIFEST_NAME, blocks)
        digests = GroupDigests(plan, rows.table, records.read_blocks, check=records.check,
                               describe=records.describe, short_halos=records.short_halos
                               ) if _checks._CHECKS else None
        return cls(records, digests)

    def rows(self, blocks: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        import tensorflow as tf

        read = self._records.with_next(blocks)  # and the block after a halo cut short
        stored = self._records.stored(read).get_single_element()
        rows, raw, offsets, halos = self._records.decode(read, tf.ensure_shape(stored, [None]))
        if self._digests is not None:
            rows = self._digests.checked(rows, raw, read, offsets, halos, blocks)
        return rows, tf.gather(offsets, tf.searchsorted(read, blocks))


def group_reads(plan: ReadPlan, blocks: np.ndarray, *, graph_reads: bool = True
                ) -> GraphReads | NumpyReads:
    """How the plan's groups (of ``blocks``) read their rows: in the graph where
    its store allows (unless ``graph_reads=False``), else the NumPy path."""
    graph = GraphReads.of(plan, blocks) if graph_reads else None
    return graph if graph is not None else NumpyReads(plan)
