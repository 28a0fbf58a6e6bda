"""The PyTorch reader: a map-style ``torch.utils.data.Dataset`` of whole batches.

Item ``i`` is batch ``i`` of the current epoch, cut by
:class:`windowkit.readers.epoch.batches.EpochBatches` (one vectorized
gather a batch, no Python per window) and handed over as tensors; it is meant
for ``DataLoader(dataset, batch_size=None, num_workers=N)``, which then
neither batches nor collates again.

- **Epochs**: each epoch has its seeded order, the same in every worker and
  every rank. Each pass over the dataset is the next epoch: asking for a batch
  already read this epoch starts the next one. :meth:`WindowTorchDataset.set_epoch`
  (as ``DistributedSampler.set_epoch``; Accelerate calls it) sets the epoch
  explicitly. The epoch lives in shared memory, so workers follow it even with
  ``persistent_workers=True``.
- **Ranks**: rank ``rank`` of ``world_size`` (by default those of
  ``torch.distributed`` when it is initialized) owns a contiguous piece of the
  split, within one window of every other rank's, and reads only its own
  storage blocks. Every rank yields the same number of batches (what
  ``DistributedDataParallel`` needs): a rank one window short repeats its last
  one, as ``DistributedSampler`` pads. The dataset's items are *every* rank's
  batches, interleaved (item ``j`` is rank ``j % world_size``'s batch
  ``j // world_size``), which is what a ``DistributedSampler(ds,
  shuffle=False)`` hands each rank: the sampler that Lightning and Accelerate
  add by default, and the one to pass in a plain DDP loop. A rank asked for
  another rank's batch (a loader not split by rank, or a shuffling sampler)
  stops with one line saying what to pass.
- **Workers**: the dataset pickles as its read plan and arguments; each
  worker opens the files itself, on first use, with ``fork`` or ``spawn``.
  Rows held for a uniform shuffle before a ``fork`` are shared with the
  workers; spawned workers hold their own.
- **Resuming**: ``state_dict()``/``load_state_dict()`` (torchdata's
  ``Stateful``) carry the epoch, and a batch depends on nothing but its
  epoch and index, so ``StatefulDataLoader`` resumes mid-epoch with exactly
  the batches an uninterrupted run would yield. A state saved on another
  number of ranks goes on with the windows that epoch had left, spread over
  this run's ranks, once the sampler (:meth:`WindowTorchDataset.sampler`)
  has said how many batches the saved run had read.
"""

from __future__ import annotations

import multiprocessing
import operator
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from windowkit.errors import InvalidSpecError, check_int
from windowkit.readers.epoch.batches import EpochBatches
from windowkit.readers.epoch.saved import ADOPTING_KEYS, EPOCH_LIMIT, check_epoch, check_saved_for

#: what a torch state must match: not the rank (ranks step together, and
#: trainers such as Lightning save one rank's loader state for all of them)
_STATE_KEYS = tuple(key for key in ADOPTING_KEYS if key != "shard")
#: what a state saved on another number of ranks must match
_REGROUP_KEYS = tuple(key for key in _STATE_KEYS if key != "num_shards")


def as_tensors(batch: Any) -> Any:
    """A NumPy batch (an array, a tuple or a dict of them) as tensors, no copy."""
    if isinstance(batch, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(batch))
    if isinstance(batch, tuple):
        return tuple(as_tensors(part) for part in batch)
    if isinstance(batch, dict):
        return {key: as_tensors(value) for key, value in batch.items()}
    raise TypeError(f"not a batch: {type(batch).__name__}")


class WindowTorchDataset(torch.utils.data.Dataset):
    """Batches of windows of one split (every rank's, interleaved): ``x``, or
    ``(x, y)`` with a horizon, as tensors. Build it with
    :meth:`windowkit.Store.torch_dataset`."""

    def __init__(self, batches: EpochBatches, *, rank: int = 0, world_size: int = 1) -> None:
        self.batches = batches
        self.rank, self.world_size = rank, world_size
        # shared memory, so that workers (forked, spawned, persistent) follow the epoch:
        # [epoch, batches of it read before a restore (-1: none)], and which batches
        # this epoch read (counted from the restored ones)
        self._epoch_state = torch.tensor([0, -1], dtype=torch.int64).share_memory_()
        self._read = torch.zeros(batches.batches_per_epoch + 2,
                                 dtype=torch.uint8).share_memory_()
        # a lock workers can share however they start (a spawn context's works for fork too)
        self._lock = multiprocessing.get_context("spawn").Lock()
        #: a state saved on another number of ranks, until the sampler says how far it got
        self._regrouping: dict[str, Any] | None = None
        #: the state the sampler just restored (loaded again by a 0-worker loader)
        self._sampler_restored: dict[str, Any] | None = None
        batches.hold()  # held now, so that forked workers share the rows

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if multiprocessing.context.get_spawning_popen() is None:
            state["_lock"] = None  # pickled for storage, not for a worker: a new lock there
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self._lock is None:
            self._lock = multiprocessing.get_context("spawn").Lock()

    @property
    def epoch(self) -> int:
        """The epoch whose order items follow (0 first)."""
        return int(self._epoch_state[0].item())

    def set_epoch(self, epoch: int) -> None:
        """Follow epoch ``epoch``'s order from now on (as ``DistributedSampler.set_epoch``)."""
        epoch = check_epoch(epoch)
        with self._lock:
            if epoch != self._epoch_state[0]:
                self._epoch_state[1] = -1  # the restored count was another epoch's
            self._epoch_state[0] = epoch
            self._read.zero_()

    def _epoch_of(self, batch: int) -> int:
        """The epoch batch ``batch`` (this rank's) is read in: the current one, or
        the next when the batch was already read in the current one, or before
        its restore (a new pass)."""
        with self._lock:
            restored = max(0, int(self._epoch_state[1].item()))
            if batch < restored or self._read[batch - restored]:
                self._epoch_state[0] += 1
                self._epoch_state[1] = -1
                self._read.zero_()
                restored = 0
            self._read[batch - restored] = 1
            return int(self._epoch_state[0].item())

    @property
    def batch_size(self) -> int:
        return self.batches.batch_size

    @property
    def batches_per_rank(self) -> int:
        """Batches each rank counts in the current epoch."""
        self._regroup()
        return self.batches.batches_in(self.epoch)

    @property
    def num_windows(self) -> int:
        """Windows the current epoch yields on each rank (padded to the largest
        rank's share)."""
        return self.batches.windows_in(self.epoch)

    def __len__(self) -> int:
        """Every rank's batches: ``world_size`` times the batches of one rank."""
        return self.batches_per_rank * self.world_size

    def __getitem__(self, index: int | Sequence[int]) -> Any:
        """Item ``index``: rank ``index % world_size``'s batch ``index //
        world_size`` of the current epoch (this rank's only; negative counts
        from the end). A one-element list of an index works too (batch samplers)."""
        if isinstance(index, Sequence) and not isinstance(index, str) and len(index) == 1:
            index = index[0]
        i = operator.index(index)  # type: ignore[arg-type]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"batch {index} is out of range for {n} batches")
        i %= n
        self._sampler_restored = None
        if self._regrouping is not None:
            raise InvalidSpecError(
                f"this dataset was given a state saved on {self._regrouping['num_shards']} "
                f"ranks (it has {self.world_size}): load it into a StatefulDataLoader built "
                "with sampler=dataset.sampler(), which says how far the saved run got")
        owner, batch = i % self.world_size, i // self.world_size
        if owner != self.rank:
            raise InvalidSpecError(
                f"rank {self.rank} of {self.world_size} was asked for item {i}, a batch of "
                f"rank {owner}: this DataLoader is not split by rank; give it "
                "sampler=dataset.sampler() (plain DDP, Lightning), or hand Accelerate "
                "DataLoader(dataset, batch_size=1, collate_fn=dataset.collate) to split")
        return as_tensors(self.batches.batch_at(self._epoch_of(batch), batch))

    def sampler(self) -> WindowSampler:
        """A ``DistributedSampler`` of this rank's items, in order, whose
        ``set_epoch`` sets the dataset's epoch: the sampler for a plain DDP loop
        and for Lightning (which keeps a ``DistributedSampler`` it is given and
        sets its epoch every epoch)."""
        return WindowSampler(self)

    @staticmethod
    def collate(items: list[Any]) -> Any:
        """For ``DataLoader(ds, batch_size=1, collate_fn=ds.collate)``: the one
        item (a whole batch) as it is. Accelerate shards such a loader's
        batches, so it is the loader to hand ``accelerator.prepare``."""
        if len(items) != 1:
            raise InvalidSpecError(f"collate takes one item (a whole batch) at a time, got "
                                   f"{len(items)}: build the loader with batch_size=1")
        return items[0]

    # -- resuming on any number of ranks --------------------------------------------
    def position_after(self, batches: int) -> dict[str, Any]:
        """Where the current epoch stands once every rank has read ``batches``
        batches of it (ranks step together): a small JSON-able dict to save
        with the model, for :meth:`resume` on any number of ranks."""
        return self.batches.position_after(self.epoch, batches)

    def resume(self, position: dict[str, Any]) -> None:
        """Go on from a :meth:`position_after` saved with any number of ranks:
        the rest of its epoch (every window it had left, once, over this
        dataset's ranks), then whole epochs. One line for a position of
        another store, split, seed or shuffle."""
        self.set_epoch(self.batches.resume(position))

    # -- torchdata's Stateful protocol (StatefulDataLoader) ---------------------------
    def state_dict(self) -> dict[str, Any]:
        """The epoch (with the stops of a :meth:`resume` within it), its order,
        and what it was saved for (store, split, seed, batches, ranks)."""
        return self.batches.state_at(self.epoch)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go on in the saved epoch, in the saved order, resumed as it was
        (``StatefulDataLoader`` then skips the batches already read). Any rank
        takes any rank's state (ranks step together). A state saved on another
        number of ranks goes on once the sampler's state says how many batches
        were read (:meth:`sampler`): the windows not read, over this run's
        ranks. A state saved for another store, split, seed, shuffle or batch
        size is one line."""
        if state == self._sampler_restored:  # the sampler's, loaded again (0 workers)
            self._sampler_restored = None
            return
        if not isinstance(state, dict) or "epoch" not in state:
            raise InvalidSpecError("not a windowkit torch dataset state: it has no 'epoch' "
                                   "(pass what state_dict() returned)")
        if state.get("num_shards", self.world_size) == self.world_size:
            self._regrouping = None
            epoch = self.batches.restore_state(state, _STATE_KEYS, what="state")
        else:  # checked now, regrouped once the sampler's count comes
            check_saved_for(state, self.batches.identity(), _REGROUP_KEYS, what="state")
            epoch = check_epoch(state["epoch"])
            self._regrouping = state
        self.set_epoch(epoch)
        with self._lock:
            self._epoch_state[1] = -1

    def _restored_at(self, given: int) -> None:
        """The sampler restored its count: ``given`` batches of the restored
        epoch were read before (shared, so workers learn it too)."""
        with self._lock:
            self._epoch_state[1] = given
        self._regroup()
        whole = self.batches.batches_per_epoch
        if self.batches_per_rank > whole:
            warnings.warn(
                f"resumed on {self.world_size} ranks from a state saved on fewer, epoch "
                f"{self.epoch} counts {self.batches_per_rank} batches a rank (going on at "
                f"batch {given}), more than a whole epoch's {whole}: a trainer that counted "
                "the epoch's batches before restoring (Lightning) ends it early; resume "
                "mid-epoch on at most as many ranks as saved, or at an epoch's end",
                stacklevel=3)

    def _regroup(self) -> None:
        """Regroup a state saved on another number of ranks once the sampler's
        count has come (in every process: workers learn it from shared memory)."""
        state = self._regrouping
        if state is None:
            return
        if state["epoch"] != self.epoch:  # the run has moved on from that epoch
            self._regrouping = None
            return
        given = int(self._epoch_state[1].item())
        if given >= 0:
            self._regrouping = None
            self.batches.regroup(state, _REGROUP_KEYS, given)

    def __repr__(self) -> str:
        plan = self.batches.plan
        return (f"<windowkit.WindowTorchDataset {str(plan.store.path)!r} split={plan.split!r} "
                f"batches={self.batches_per_rank} per rank batch_size={self.batch_size} "
                f"shuffle={self.batches.order.shuffle} rank={self.rank}/{self.world_size} "
                f"epoch={self.epoch}>")


class WindowSampler(torch.utils.data.DistributedSampler):
    """This rank's items of a :class:`WindowTorchDataset`, in order (rank
    ``r`` of ``n``: items ``r, r + n, ...``); ``set_epoch`` sets the
    dataset's epoch. Being a ``DistributedSampler``, trainers keep it as it is
    and set its epoch."""

    def __init__(self, dataset: WindowTorchDataset) -> None:
        super().__init__(dataset, num_replicas=dataset.world_size, rank=dataset.rank,
                         shuffle=False, drop_last=False)
        self.windows = dataset

    def __iter__(self) -> RankItems:
        return RankItems(self.windows)

    # torchdata's Stateful protocol: StatefulDataLoader restores the sampler in
    # the main process, where its workers' dataset states never arrive
    def state_dict(self) -> dict[str, Any]:
        """The dataset's state (:meth:`WindowTorchDataset.state_dict`)."""
        return self.windows.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the dataset's state in this process too, so that this
        sampler counts the restored epoch's batches."""
        self.windows.load_state_dict(state)
        self.windows._sampler_restored = state

    def __len__(self) -> int:
        return self.windows.batches_per_rank

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        self.windows.set_epoch(epoch)


class RankItems:
    """A rank's items of the current epoch, counted as they are asked for (so
    an epoch restored after this iterator was made is the one counted); its
    state is how many it gave, for ``StatefulDataLoader``."""

    def __init__(self, dataset: WindowTorchDataset) -> None:
        self.dataset = dataset
        self.given = 0

    def __iter__(self) -> RankItems:
        return self

    def __next__(self) -> int:
        data = self.dataset
        item = data.rank + self.given * data.world_size
        if item >= len(data):
            raise StopIteration
        self.given += 1
        return item

    def state_dict(self) -> dict[str, int]:
        return {"given": self.given}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go on after the ``given`` items; the dataset (every process's)
        learns that its restored epoch's first ``given`` batches were read."""
        if not isinstance(state, dict):
            raise InvalidSpecError("not a windowkit sampler state: pass what state_dict() "
                                   "returned")
        given = check_int("given", state.get("given"), 0)
        if given > EPOCH_LIMIT:
            raise InvalidSpecError(f"the saved sampler state gave {given} batches, more "
                                   "than an epoch can have")
        self.given = given
        self.dataset._restored_at(given)
