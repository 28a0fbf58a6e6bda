"""Which epoch each iteration of a ``tf.data`` reader reads.

Every reader follows one order per ``(seed, epoch)``; a ``tf.data.Dataset``
has no epoch argument, so each iteration of the reader's dataset is the next
epoch: an :class:`EpochCounter` (a one-entry table, not a variable, so that a
distribution strategy's scope leaves it alone) holds the epoch the next
iteration reads. An iteration reads it when it starts, and sets it to the
epoch after its own when its last batch has been made: reading it again (as
restoring a checkpoint does) gives the same epoch. An iteration left before
its end does not move the counter on: the next one reads the same epoch.

The reader's dataset carries the counter into its iterators
(:class:`EpochedDataset`), so ``tf.train.Checkpoint(iterator=it)`` saves and
restores the epoch along with the position in it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from windowkit.errors import check_int

if TYPE_CHECKING:
    import tensorflow as tf


class EpochCounter:
    """The epoch the next iteration reads, starting at ``first``."""

    def __init__(self, first: int = 0) -> None:
        import tensorflow as tf

        self.first = check_int("epoch", first, 0)
        with tf.init_scope():
            self.table = tf.lookup.experimental.MutableHashTable(
                tf.int64, tf.int64, default_value=self.first, name="windowkit_next_epoch")

    def next_epoch(self) -> tf.Tensor:
        """The epoch the next iteration reads (int64 scalar)."""
        import tensorflow as tf

        return tf.reshape(self.table.lookup(tf.constant(0, tf.int64)), [])

    def finish(self, epoch: tf.Tensor) -> tf.Operation:
        """Move on past ``epoch`` (idempotent)."""
        import tensorflow as tf

        return self.table.insert(tf.constant([0], tf.int64), tf.reshape(epoch + 1, [1]))

    def epochs(self, make_epoch: Callable[[tf.Tensor], tf.data.Dataset]) -> tf.data.Dataset:
        """One iteration of the returned dataset: ``make_epoch(e)`` of the epoch
        ``e`` the counter holds, then the counter moved on past ``e``."""
        import tensorflow as tf

        def one_epoch(epoch: tf.Tensor) -> tf.data.Dataset:
            batches = make_epoch(epoch)
            spec = batches.element_spec

            def finished(_: tf.Tensor) -> Any:  # nothing comes out: it only moves on
                with tf.control_dependencies([self.finish(epoch)]):
                    return tf.nest.map_structure(_empty_like, spec)

            end = tf.data.Dataset.from_tensors(tf.constant(0, tf.int64)).map(finished)
            return batches.concatenate(end.filter(lambda *_: tf.constant(False)))

        start = tf.data.Dataset.from_tensors(tf.constant(0, tf.int64))
        return start.map(lambda _: self.next_epoch()).flat_map(one_epoch)


def _empty_like(spec: tf.TensorSpec) -> tf.Tensor:
    """Zeros of ``spec``'s shape, unknown sizes 0 (an element never yielded)."""
    import tensorflow as tf

    if spec.shape.rank is None:
        return tf.zeros([0], spec.dtype)
    return tf.zeros([0 if d is None else d for d in spec.shape], spec.dtype)


_EPOCH_KEY = "windowkit_next_epoch"


def epoched(ds: tf.data.Dataset, counter: EpochCounter) -> tf.data.Dataset:
    """``ds``, whose iterators save ``counter`` in their checkpoints and restore
    it before their position (which reads it)."""
    from tensorflow.python.data.ops import dataset_ops, iterator_ops

    class EpochIterator(iterator_ops.OwnedIterator):
        """An iterator whose checkpoint holds the epoch counter too."""

        def _serialize_to_tensors(self) -> dict[str, Any]:
            tensors = dict(super()._serialize_to_tensors())
            tensors[_EPOCH_KEY] = counter.next_epoch()
            return tensors

        def _restore_from_tensors(self, restored_tensors: dict[str, Any]) -> Any:
            restored = dict(restored_tensors)
            epoch = restored.pop(_EPOCH_KEY, None)
            if epoch is not None:
                counter.table.insert(tf_constant_key(), [epoch])
            return super()._restore_from_tensors(restored)

    class EpochedDataset(dataset_ops.UnaryUnchangedStructureDataset):
        """A reader's dataset whose iterators carry its epoch counter."""

        def __init__(self, input_dataset: tf.data.Dataset) -> None:
            self.epoch_counter = counter
            super().__init__(input_dataset, input_dataset._variant_tensor)

        def __iter__(self) -> Any:
            import tensorflow as tf

            if tf.inside_function():
                return super().__iter__()
            return EpochIterator(self)

    return EpochedDataset(ds)


def tf_constant_key() -> tf.Tensor:
    import tensorflow as tf

    return tf.constant([0], tf.int64)
