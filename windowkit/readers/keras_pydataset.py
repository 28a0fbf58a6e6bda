"""The Keras reader: a ``keras.utils.PyDataset`` of whole batches.

``__getitem__(i)`` is batch ``i`` of the current epoch, cut by
:class:`windowkit.readers.epoch.batches.EpochBatches` (random access in
the epoch's seeded order, so Keras workers may ask for batches in any order;
one vectorized gather a batch). ``on_epoch_end`` moves on to the next epoch.

The dataset pickles as its read plan and arguments (the compact window runs
travel along); each process builds its own block cache on first use, so it
works with ``workers > 1`` threads and with ``use_multiprocessing=True``.

The dataset already shuffles: pass ``shuffle=False`` to ``model.fit``, which
otherwise also shuffles the batch order and so defeats the block cache.

Resuming mid-epoch: the dataset has a position, ``(epoch, batch)``, settable
with :meth:`WindowPyDataset.seek` (or :meth:`WindowPyDataset.resume`);
``fit`` then trains the rest of that epoch, then whole epochs.
:meth:`WindowPyDataset.backup_and_restore` gives a
``keras.callbacks.BackupAndRestore`` that saves that position with the
weights and restores both, so an interrupted ``fit`` goes on at the batch
where it stopped, in the same order (on another machine too: the position
carries the epoch order).

Keras counts an epoch's batches once, before the first epoch, and calls
``on_epoch_end`` once before it too (to reset its iterator). The dataset
tells Keras a whole epoch's batches and ignores an ``on_epoch_end`` from Keras
while no epoch is under way, so that a resumed epoch is trained from where it
stopped, and the whole epochs after it are trained whole.
"""

from __future__ import annotations

import json
import operator
import os
import sys
import warnings
from typing import TYPE_CHECKING, Any

import fsspec
import keras

from windowkit.errors import InvalidSpecError, check_int
from windowkit.readers import BatchOptions, ShuffleOptions
from windowkit.readers.epoch.batches import Batch, EpochBatches
from windowkit.readers.epoch.saved import ADOPTING_KEYS, check_epoch

if TYPE_CHECKING:
    from windowkit.readers.plan import ReadPlan


class WindowPyDataset(keras.utils.PyDataset):
    """Batches of windows of one split of a store: ``x``, or ``(x, y)`` with a horizon.

    Build it with :meth:`windowkit.Store.keras_dataset`.
    """

    def __init__(self, plan: ReadPlan, batch: BatchOptions | None = None,
                 order: ShuffleOptions | None = None, *, workers: int = 1,
                 use_multiprocessing: bool = False, max_queue_size: int = 10) -> None:
        super().__init__(workers=check_int("workers", workers, 0),
                         use_multiprocessing=bool(use_multiprocessing),
                         max_queue_size=check_int("max_queue_size", max_queue_size, 1))
        self.batches = EpochBatches(plan, batch, order)
        self.plan = plan
        self.batch_size = self.batches.batch_size  # Keras' own name for it
        self._epoch = 0
        self._first_batch = 0  # batches of epoch `_epoch` already done (resuming)
        self._running = False  # Keras began an epoch and has not ended it
        self._quiet: warnings.catch_warnings[Any] | None = None
        self.batches.hold()  # held now, so that forked workers share the rows

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_quiet"] = None  # the main process's warning filter stays there
        return state

    # -- the PyDataset protocol ------------------------------------------------------
    @property
    def epoch(self) -> int:
        """The epoch whose order ``__getitem__`` follows (0 first); settable to resume."""
        return self._epoch

    @epoch.setter
    def epoch(self, value: int) -> None:
        self._epoch = check_epoch(value)

    @property
    def position(self) -> tuple[int, int]:
        """``(epoch, batch)``: the epoch whose order ``__getitem__`` follows and
        the batches of it already done (0 unless resumed with :meth:`seek`)."""
        return self._epoch, self._first_batch

    def seek(self, epoch: int, batch: int = 0) -> None:
        """Go on from batch ``batch`` of epoch ``epoch``: until that epoch ends,
        ``len()`` counts the batches left and ``self[i]`` is batch ``batch + i``."""
        epoch, batch = check_epoch(epoch), check_int("batch", batch, 0)
        if batch > self.batches.batches_in(epoch):
            raise InvalidSpecError(f"batch {batch} is beyond the epoch's "
                                   f"{self.batches.batches_in(epoch)} batches")
        self._epoch, self._first_batch = epoch, batch

    @property
    def batches_per_epoch(self) -> int:
        """Batches of the current epoch (fewer in one resumed part-way)."""
        return self.batches.batches_in(self._epoch)

    def position_after(self, batches: int) -> dict[str, Any]:
        """Where the current epoch stands once every shard has read ``batches``
        batches of it: a small JSON-able dict, for :meth:`resume` on any
        number of shards."""
        return self.batches.position_after(self._epoch, batches)

    def resume(self, position: dict[str, Any]) -> None:
        """Go on from a :meth:`position_after` saved with any number of shards:
        the rest of its epoch (every window it had left, once, over the
        shards), then whole epochs."""
        self._epoch = self.batches.resume(position)
        self._first_batch = 0

    @property
    def num_windows(self) -> int:
        return self.plan.num_windows

    def __len__(self) -> int:
        """The batches left in the current epoch (all of them unless resumed)."""
        return self.batches_per_epoch - self._first_batch

    @property
    def num_batches(self) -> int:
        """What Keras counts: the batches left while it trains an epoch, and a
        whole epoch's when it counts ahead (before ``fit``'s first epoch, for
        every epoch), so that a resumed epoch does not cut the whole ones
        after it short (Keras stops the resumed one where its batches end)."""
        return len(self) if self._running else self.batches.batches_per_epoch

    def __getitem__(self, index: int) -> Batch:
        """Batch ``index`` of what is left of the current epoch (negative counts
        from the end)."""
        i = operator.index(index)
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"batch {index} is out of range for {n} batches")
        return self.batches.batch_at(self._epoch, i % n + self._first_batch)

    def on_epoch_begin(self) -> None:
        """Keras begins training an epoch: the current one, from its position."""
        self._running = True
        if len(self) < self.batches.batches_per_epoch and self._quiet is None:
            # Keras counted a whole epoch; the resumed one has fewer batches, by design
            self._quiet = warnings.catch_warnings()
            self._quiet.__enter__()
            warnings.filterwarnings("ignore", message=_SHORT_EPOCH_WARNING)

    def on_epoch_end(self) -> None:
        """Move on to the next epoch's order, at the end of an epoch (one that
        Keras began, or a loop's own). Keras' call before ``fit``'s first
        epoch, with no epoch begun, leaves the position as it is."""
        if self._quiet is not None:
            self._quiet.__exit__(None, None, None)
            self._quiet = None
        if not self._running and _keras_outside_an_epoch():
            return
        self._running = False
        self._epoch += 1
        self._first_batch = 0

    def backup_and_restore(self, backup_dir: str | os.PathLike[str], *,
                           save_freq: int | str = "epoch", double_checkpoint: bool = False,
                           delete_checkpoint: bool = True) -> WindowBackupAndRestore:
        """A ``keras.callbacks.BackupAndRestore`` that also saves and restores this
        dataset's position, so that ``fit`` resumes at the batch where it stopped."""
        return WindowBackupAndRestore(self, os.fspath(backup_dir), save_freq=save_freq,
                                      double_checkpoint=double_checkpoint,
                                      delete_checkpoint=delete_checkpoint)

    def __repr__(self) -> str:
        plan = self.plan
        return (f"<windowkit.WindowPyDataset {str(plan.store.path)!r} split={plan.split!r} "
                f"batches={len(self)} batch_size={self.batch_size} "
                f"shuffle={self.batches.order.shuffle} "
                f"epoch={self._epoch}>")


_POSITION_KEY = "windowkit_position"
# what Keras says when an epoch has fewer batches than it counted at the start;
# the resumed epoch has, by design
_SHORT_EPOCH_WARNING = "Your input ran out of data"


class WindowBackupAndRestore(keras.callbacks.BackupAndRestore):
    """Keras' ``BackupAndRestore`` that resumes mid-epoch: with the weights it
    saves the dataset's position (epoch order, batches done), and on restore
    seeks the dataset there, so the rest of the interrupted epoch is trained in
    its order, then the epochs that follow.

    Keras itself restores only the epoch (the interrupted epoch starts again
    at its first batch) and, after a restore, records epoch 0 until an epoch
    ends; this class corrects both. Build it with
    :meth:`WindowPyDataset.backup_and_restore`.
    """

    def __init__(self, dataset: WindowPyDataset, backup_dir: str, **kwargs: Any) -> None:
        super().__init__(backup_dir, **kwargs)
        self.dataset = dataset
        self._epoch_start: tuple[int, int] = dataset.position
        self._batches_done = 0  # in the current Keras epoch

    def _load_model(self) -> None:
        super()._load_model()
        metadata = self._read_metadata()
        saved = metadata.get(_POSITION_KEY) if metadata else None
        if saved is None:
            return
        batches = self.dataset.batches
        epoch = batches.restore_state(saved, ADOPTING_KEYS, what="Keras backup")
        batch = check_int("batch", saved.get("batch"), 0)
        if batch >= batches.batches_in(epoch):  # saved after its last batch
            epoch, batch = epoch + 1, 0
            self.model._initial_epoch = (self.model._initial_epoch or 0) + 1
        self.dataset.seek(epoch, batch)

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._current_epoch = epoch
        self._epoch_start = self.dataset.position
        self._batches_done = 0

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._batches_done = batch + 1
        super().on_train_batch_end(batch, logs)

    def _save_model(self) -> None:
        super()._save_model()
        epoch, first = self._epoch_start
        if self.dataset.position[0] != epoch:  # at an epoch's end: the next one, from 0
            epoch, batch = self.dataset.position[0], 0
        else:
            batch = first + self._batches_done
        metadata = self._read_metadata() or {}
        metadata[_POSITION_KEY] = {**self.dataset.batches.state_at(epoch), "batch": batch}
        with fsspec.open(self._training_metadata_path, "w") as f:
            json.dump(metadata, f)

    def _read_metadata(self) -> dict[str, Any] | None:
        """Keras' training metadata (a JSON object), None if there is none."""
        fs, path = fsspec.core.url_to_fs(self._training_metadata_path)
        if not fs.exists(path):
            return None
        with fs.open(path, "r") as f:
            return dict(json.load(f))


def _keras_outside_an_epoch() -> bool:
    """Whether ``on_epoch_end`` was called by Keras' ``PyDataset`` adapter with
    no epoch under way (its ``EpochIterator.reset()``, before ``fit``'s,
    ``evaluate``'s or ``predict``'s first epoch): then no epoch ended."""
    try:
        from keras.src.trainers.data_adapters.py_dataset_adapter import PyDatasetAdapter
    except ImportError:  # pragma: no cover - another Keras layout: every call counts
        return False
    caller = sys._getframe(2).f_locals.get("self")
    return isinstance(caller, PyDatasetAdapter) and not getattr(caller, "_within_epoch", True)
