"""Which epoch each iteration of a ``tf.data`` reader reads.

Every reader follows one order per ``(seed, epoch)``; a ``tf.data.Dataset`` has
no epoch argument, so each iteration of the reader's dataset is the next epoch.
The reader's dataset (:class:`EpochedDataset`) counts in Python: each iterator
it makes takes the next epoch (the first is the reader's ``epoch=``), and
:meth:`EpochedDataset.set_epoch` sets the next one, as
``DistributedSampler.set_epoch`` does. The epoch reaches the graph through a
one-entry table (:class:`EpochCounter`, not a variable, so a distribution
strategy's scope leaves it alone), read when the iteration reads its first
batch; nothing in the pipeline writes to it (symbolic checkpointing would warn
at every element of a pipeline holding a function that writes).

``ds.repeat()`` goes on through the following epochs inside one iteration
(``e``, ``e + 1``, ..., computed in the graph). An iterator's checkpoint
(``tf.train.Checkpoint(iterator=it)``) holds the epoch it started at and what
the reader was built for (store, split, order, batches, shards): restoring it
into a reader built otherwise is one line, and restoring it sets the table
before the position is restored (which reads it).
Iterations the dataset does not make itself (a distribution strategy's
distributed dataset, iterating inside a ``tf.function``) read the epoch last
set: call ``set_epoch`` before each epoch there, or give Keras ``fit`` the
dataset's ``epoch_callback()``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tensorflow.python.data.ops import dataset_ops, iterator_ops

from windowkit.errors import InvalidSpecError
from windowkit.readers.epoch.saved import GRAPH_KEYS, check_epoch, check_saved_for

if TYPE_CHECKING:
    import tensorflow as tf

_EPOCH_KEY = "windowkit_epoch"
_SAVED_FOR_KEY = "windowkit_saved_for"


class EpochCounter:
    """The epoch iterations read: ``current`` in the graph's table, ``next``
    the one the next iterator takes."""

    def __init__(self, first: int = 0) -> None:
        import tensorflow as tf

        self.next = check_epoch(first)
        with tf.init_scope():
            self.table = tf.lookup.experimental.MutableHashTable(
                tf.int64, tf.int64, default_value=self.next, name="windowkit_epoch")

    def current(self) -> tf.Tensor:
        """The epoch an iteration reads (an int64 scalar, in the graph)."""
        import tensorflow as tf

        return tf.reshape(self.table.lookup(tf.constant(0, tf.int64)), [])

    def set(self, epoch: int) -> None:
        """Iterations read ``epoch`` from now on; the next iterator takes the one after."""
        import tensorflow as tf

        epoch = check_epoch(epoch)
        with tf.init_scope():
            self.table.insert(tf.constant([0], tf.int64), tf.constant([epoch], tf.int64))
        self.next = epoch + 1

    def take(self, epochs: int | None = 1) -> int:
        """The first epoch of a new iterator reading ``epochs`` epochs: the next
        one, made current; the iterator after it starts past them."""
        epoch = self.next
        self.set(epoch)
        self.next = epoch + (epochs or 1)
        return epoch

    def epochs(self, make_epoch: Callable[[tf.Tensor], tf.data.Dataset],
               count: int | None = 1, guard: int = 0) -> tf.data.Dataset:
        """One iteration of the returned dataset: ``make_epoch(e)`` of the
        current epoch ``e``, then of ``e + 1``, ... ``count`` epochs in all
        (``None``: without end).

        The epochs travel as numbers of a ``range`` (``guard``, 30 bits naming
        the reader, above the epoch's 32), numbered, the first one (``e - 1``,
        number 0) reading nothing: once a range has given a number, a
        checkpoint holds its position as that number itself, so an iterator
        restored behind any transform reads the saved epoch (the table is
        read only when an iteration starts afresh), and an epoch whose guard
        is not this reader's is one line."""
        import tensorflow as tf

        base = guard << _EPOCH_BITS
        start = tf.data.Dataset.from_tensors(tf.constant(0, tf.int64))
        first = start.map(lambda _: self.current())
        take = -1 if count is None else count + 1

        def numbers(e: tf.Tensor) -> tf.data.Dataset:
            # one end for every guard: a restored position past it would end the epochs
            return tf.data.Dataset.range(base + e - 1, _NUMBERS_END).take(take).enumerate()

        def epoch_of(index: tf.Tensor, number: tf.Tensor) -> tf.data.Dataset:
            # in the graph (no Python): the first number reads nothing; the others
            # carry this reader's guard, else the checkpoint was another reader's
            first_one = tf.equal(index, 0)
            ours = tf.equal(tf.bitwise.right_shift(number, _EPOCH_BITS), guard)
            check = tf.debugging.Assert(tf.logical_or(first_one, ours), [_OTHER_READER])
            with tf.control_dependencies([check]):
                epoch = tf.where(first_one, tf.constant(0, tf.int64),
                                 tf.bitwise.bitwise_and(number, 2**_EPOCH_BITS - 1))
            return make_epoch(epoch).take(tf.where(first_one, tf.constant(0, tf.int64), -1))

        return first.flat_map(numbers).flat_map(epoch_of)


_EPOCH_BITS = 32
_NUMBERS_END = 2**62  # above every guard's numbers
#: what restoring another reader's iterator checkpoint says (carried by TensorFlow's error)
_OTHER_READER = (f"{InvalidSpecError.__module__}.{InvalidSpecError.__name__}: the iterator "
                 "checkpoint restored here was saved by a windowkit reader built otherwise "
                 "(store, split, seed, order, batch size or shards): build the reader as it "
                 "was when it was saved")


def reader_guard(saved_for: dict[str, Any]) -> int:
    """30 bits naming what a reader is for (:func:`windowkit.readers.epoch.saved.saved_for`)."""
    text = json.dumps({key: saved_for[key] for key in GRAPH_KEYS}, sort_keys=True).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=4).digest(), "big") >> 2


Build = Callable[[EpochCounter, "int | None"], "tf.data.Dataset"]  # (counter, epochs) -> dataset


def epoched(build: Build, counter: EpochCounter, saved_for: dict[str, Any],
            epochs: int | None = 1) -> tf.data.Dataset:
    """``build(counter, epochs)`` as an :class:`EpochedDataset` (``saved_for``:
    what its checkpoints are for, see :func:`windowkit.readers.epoch.saved.saved_for`)."""
    return EpochedDataset(build, counter, epochs, saved_for)


class EpochIterator(iterator_ops.OwnedIterator):
    """An iterator starting at one epoch, whose checkpoint holds that epoch
    and what its reader was built for (checked when it is restored)."""

    def __init__(self, dataset: EpochedDataset, epoch: int) -> None:
        self.windowkit_epoch = epoch
        self._counter, self._saved_for = dataset.epoch_counter, dataset.saved_for
        super().__init__(dataset)

    def _serialize_to_tensors(self) -> dict[str, Any]:
        import tensorflow as tf

        tensors = dict(super()._serialize_to_tensors())
        tensors[_EPOCH_KEY] = tf.constant(self.windowkit_epoch, tf.int64)
        tensors[_SAVED_FOR_KEY] = tf.constant(json.dumps(self._saved_for, sort_keys=True))
        return tensors

    def _restore_from_tensors(self, restored_tensors: dict[str, Any]) -> Any:
        restored = dict(restored_tensors)
        saved_for = restored.pop(_SAVED_FOR_KEY, None)
        if saved_for is not None:
            check_saved_for(json.loads(saved_for.numpy()), self._saved_for, GRAPH_KEYS,
                            what="iterator checkpoint")
        epoch = restored.pop(_EPOCH_KEY, None)
        if epoch is not None:
            self.windowkit_epoch = int(epoch)
            self._counter.set(self.windowkit_epoch)
        return super()._restore_from_tensors(restored)


class EpochedDataset(dataset_ops.UnaryUnchangedStructureDataset):
    """A reader's dataset: each iterator it makes reads the next epoch;
    ``repeat`` goes on through the epochs after it."""

    def __init__(self, build: Build, counter: EpochCounter, epochs: int | None,
                 saved_for: dict[str, Any]) -> None:
        self.epoch_counter, self._build, self._epochs = counter, build, epochs
        self.saved_for = saved_for
        dataset = build(counter, epochs)
        super().__init__(dataset, dataset._variant_tensor)

    def set_epoch(self, epoch: int) -> None:
        """The next iteration reads epoch ``epoch`` (then ``epoch + 1``, ...)."""
        self.epoch_counter.set(epoch)
        self.epoch_counter.next = epoch

    def epoch_callback(self) -> Any:
        """A Keras callback that sets the epoch ``fit`` is in before each epoch
        (also under a distribution strategy, and after ``fit`` resumes at
        ``initial_epoch``)."""
        import keras

        dataset = self

        class FollowEpochs(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
                dataset.set_epoch(epoch)

        return FollowEpochs()

    def repeat(self, count: Any = None, name: str | None = None) -> tf.data.Dataset:
        """Epoch after epoch: ``count`` epochs (``None`` or -1: without end)
        from the one the iteration starts at, each in its own order."""
        if self._epochs != 1 or name is not None or not (
                count is None or (isinstance(count, int) and count >= -1)):
            return super().repeat(count, name)
        if count == 0:
            return super().repeat(0)
        return EpochedDataset(self._build, self.epoch_counter,
                              None if count in (None, -1) else count, self.saved_for)

    def __iter__(self) -> Any:
        import tensorflow as tf

        if tf.inside_function():
            return super().__iter__()
        return EpochIterator(self, self.epoch_counter.take(self._epochs))
