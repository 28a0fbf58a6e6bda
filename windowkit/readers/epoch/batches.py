"""Batch ``i`` of epoch ``e``, as NumPy: what every framework's loader reads.

:class:`EpochBatches` answers ``batch(epoch, index)`` for one split (or one
shard of it), in any order, from any thread or process: each epoch's order is
a pure function of the seed and the epoch, so a loader's position is all its
state and a resumed run yields exactly the batches an uninterrupted one would.
The Keras ``PyDataset``, the PyTorch ``Dataset`` and the Grain source are thin
front ends over it.

How batches are cut follows the shuffle chosen for the plan
(:func:`windowkit.readers.epoch.choice.choose_shuffle`): a uniform shuffle holds
the split's rows once (:mod:`windowkit.readers.rows.held`) and cuts a
batch with one NumPy gather; block groups and index order cut from a cache of
decoded blocks (:mod:`windowkit.readers.rows.pool`).

Sharded, an epoch is the whole split's order restricted to the shard's own
windows (:mod:`windowkit.readers.epoch.shares`), padded (its last window repeated)
or trimmed so that every shard yields the same number of batches (what
distributed training needs: every rank steps together).

It pickles as its plan and options; each process builds its own block cache
on first use. Rows held before a ``fork`` are shared with the forked workers.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from windowkit.errors import InvalidSpecError, check_int
from windowkit.readers.epoch.choice import epoch_order, shuffle_choice
from windowkit.readers.epoch.order import EpochOrder, WindowOrder, num_batches
from windowkit.readers.epoch.saved import (
    check_epoch,
    check_order,
    check_saved_for,
    group_of,
    saved_for,
    saved_order,
)
from windowkit.readers.epoch.shares import (
    EpochStop,
    ShardSequence,
    ShardShare,
    checked_stops,
    regrouped,
    saved_lead,
    windows_left,
)
from windowkit.readers.options import BatchOptions, ShuffleOptions
from windowkit.readers.rows.held import HeldRows, UniformOrder
from windowkit.readers.rows.pool import WindowGather
from windowkit.stats import Normalizer

if TYPE_CHECKING:
    from windowkit.readers.plan import ReadPlan

Batch = Any  # x, (x, y), or with fields a dict x (windowkit.readers.fields)

# built per process, never pickled; "_held" is kept by forked workers (shared rows)
_PROCESS_LOCAL = ("_lock", "_pid", "_local", "_checked_epoch", "_resumed_sequence")
#: what a saved position must match to be resumed (the batch size may change:
#: a position counts windows; its order is adopted)
_POSITION_KEYS = ("store_id", "split", "seed", "shuffle")


@dataclass(frozen=True)
class _Local:
    """What one process builds to find and cut an epoch's windows."""

    full: Callable[[int, np.ndarray], np.ndarray]  # (epoch, where) -> the split's positions
    sequence: ShardSequence  # the plan's epoch positions -> the split's index positions
    gather: WindowGather | None  # cuts from blocks (None: from held rows)
    normalizer: Normalizer | None


@dataclass(frozen=True)
class _Resumed:
    """An epoch resumed part-way: its stops, this shard's piece of what is
    left, and ``lead``: batches counted before it that it does not yield
    again (a state regrouped from another shard count keeps the saved count,
    as trainers do; see :meth:`EpochBatches.regroup`)."""

    epoch: int
    stops: tuple[EpochStop, ...]
    share: ShardShare
    lead: int = 0


class EpochBatches:
    """Every epoch's batches of one plan, by ``(epoch, index)``."""

    def __init__(self, plan: ReadPlan, batch: BatchOptions | None = None,
                 order: ShuffleOptions | None = None) -> None:
        self.plan = plan
        self.batch, self.order = batch or BatchOptions(), order or ShuffleOptions()
        self.fields = plan.store.fields(self.batch.return_series)
        self.choice = shuffle_choice(plan, self.order)
        #: the epoch order followed: this machine's choice, or one adopted from a saved state
        self.epoch_order = epoch_order(plan, self.order, self.choice)
        if self.batch.normalize:
            plan.store.normalizer()  # fail now, not in a worker, if the store has no statistics
        self.windows_per_epoch = plan.windows_per_epoch(self.batch.drop_remainder)
        plan.warn_if_no_batch(self.batch)
        self._resumed: _Resumed | None = None
        self._rows_plan = plan  # whose rows are held (a resumed epoch may need more)
        self._reset_process_state()
        self._held: HeldRows | None = None

    # -- pickling and per-process state ---------------------------------------------
    def _reset_process_state(self) -> None:
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._local: _Local | None = None
        self._checked_epoch: int | None = None
        self._resumed_sequence: ShardSequence | None = None  # the resumed epoch's, cached

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()
                if k not in (*_PROCESS_LOCAL, "_held")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset_process_state()
        self._held = None  # held again by this process on first use

    def _this_process(self) -> None:
        """After a fork, drop the parent's lock and block cache (the held rows stay)."""
        if self._pid != os.getpid():
            self._reset_process_state()

    # -- what an epoch holds ---------------------------------------------------------
    @property
    def holds_rows(self) -> bool:
        """Whether batches come from the plan's rows held once (any uniform
        shuffle, chosen here or adopted: random access in NumPy is the fast
        way here)."""
        return self.choice.uniform or self.epoch_order == "uniform"

    def adopt_order(self, order: str) -> None:
        """Follow the epoch order ``order`` (:func:`windowkit.readers.epoch.saved.order_name`)
        from now on: the order a saved state was saved in, whatever this
        machine's memory budget would choose. Batches are cut as before (from
        held rows, or from the block cache, whose memory stays within the
        budget whatever the group size); adopting a uniform order holds the
        rows (spilled beyond the budget)."""
        order = check_order(order)
        if (order == "index") != (self.epoch_order == "index"):
            raise InvalidSpecError(f"the saved order {order!r} and this reader's "
                                   f"{self.epoch_order!r} differ in whether to shuffle: "
                                   "build the reader as it was when it was saved")
        if order == self.epoch_order:
            return
        self._this_process()
        with self._lock:
            self.epoch_order = order
            self._local = None
            self._resumed_sequence = None
        self.hold()

    @property
    def batch_size(self) -> int:
        return self.batch.batch_size

    @property
    def batches_per_epoch(self) -> int:
        """Batches of a whole epoch (an epoch resumed part-way may have fewer)."""
        return num_batches(self.windows_per_epoch, self.batch_size, self.batch.drop_remainder)

    def windows_in(self, epoch: int) -> int:
        """Windows epoch ``epoch`` yields (fewer in an epoch resumed part-way)."""
        resumed = self._resumed
        if resumed is not None and resumed.epoch == epoch:
            return resumed.share.windows_per_epoch(self.batch.drop_remainder)
        return self.windows_per_epoch

    def batches_in(self, epoch: int) -> int:
        """Batches epoch ``epoch`` counts (with the lead of a regrouped resume)."""
        count = num_batches(self.windows_in(epoch), self.batch_size, self.batch.drop_remainder)
        return count + self.lead_in(epoch)

    def lead_in(self, epoch: int) -> int:
        """Batches epoch ``epoch`` counts before its first one (see :meth:`regroup`)."""
        resumed = self._resumed
        return resumed.lead if resumed and resumed.epoch == epoch else 0

    def hold(self) -> None:
        """Hold the rows now when batches come from held rows (so that workers
        forked later share them); else nothing."""
        if self.holds_rows:
            self.held_rows()

    def held_rows(self) -> HeldRows:
        """The plan's rows, held once by this process (in memory or spilled)."""
        self._this_process()
        with self._lock:
            if self._held is None:
                self._held = HeldRows(self._rows_plan, memory_budget=self.choice.memory_budget,
                                      spill_dir=self.order.spill_dir)
            return self._held

    def _process_local(self) -> _Local:
        self._this_process()
        with self._lock:
            if self._local is None:
                plan = self.plan
                full: Callable[[int, np.ndarray], np.ndarray]
                gather = None
                if not self.holds_rows:
                    gather = plan.store.window_gather(self.choice.cache_bytes)
                if self.epoch_order == "uniform":
                    full = UniformOrder(plan.whole_split, seed=self.order.seed).full
                    ordered = False
                else:
                    order = WindowOrder(
                        plan.whole_split, shuffle=self.epoch_order != "index",
                        seed=self.order.seed, block_rows=plan.layout.block_rows,
                        total_rows=plan.layout.total_rows,
                        blocks_per_group=group_of(self.epoch_order))
                    full = _EpochCache(order).positions
                    ordered = not order.sampler.shuffle
                sequence = ShardSequence(plan.shard_share, full, ordered=ordered)
                norm = plan.store.normalizer() if self.batch.normalize else None
                self._local = _Local(full, sequence, gather, norm)
            return self._local

    def _sequence(self, local: _Local, epoch: int) -> ShardSequence:
        """The plan's sequence of epoch ``epoch`` (its own one if resumed part-way)."""
        resumed = self._resumed
        if resumed is None or resumed.epoch != epoch:
            return local.sequence
        sequence = self._resumed_sequence
        if sequence is None or sequence.share is not resumed.share:
            sequence = ShardSequence(resumed.share, local.full, ordered=local.sequence.ordered)
            self._resumed_sequence = sequence
        return sequence

    def _check_store(self, epoch: int) -> None:
        """Once per epoch: a replaced store is an error, even for rows already held."""
        if self._checked_epoch != epoch:
            self.plan.store.guard.check()
            self._checked_epoch = epoch

    # -- batches ---------------------------------------------------------------------
    def positions(self, index: int, epoch: int | None = None) -> np.ndarray:
        """The epoch positions batch ``index`` holds (past a shard's own windows,
        a padded epoch repeats its last one)."""
        windows = self.windows_per_epoch if epoch is None else self.windows_in(epoch)
        lead = 0 if epoch is None else self.lead_in(epoch)
        batches = num_batches(windows, self.batch_size, self.batch.drop_remainder)
        if 0 <= index < lead:
            raise IndexError(f"batch {index} of epoch {epoch} was read before it was resumed "
                             f"(it goes on at batch {lead})")
        index -= lead
        if not 0 <= index < batches:
            raise IndexError(f"batch {index + lead} is out of range for {batches + lead} "
                             "batches")
        lo = index * self.batch_size
        return np.arange(lo, min(lo + self.batch_size, windows), dtype=np.int64)

    def batch_at(self, epoch: int, index: int) -> Batch:
        """Batch ``index`` (0 first) of epoch ``epoch``."""
        return self.windows_at(epoch, self.positions(index, epoch))

    def windows_at(self, epoch: int, where: np.ndarray) -> Batch:
        """The windows at epoch positions ``where`` of epoch ``epoch``, as one batch."""
        local, starts, series = self._starts_at(epoch, where)
        fields, targets = self.fields, self.plan.store.target_positions
        columns = fields.horizon_columns(targets)
        if local.gather is None:
            x, horizon = self.held_rows().windows(starts, columns)
        else:
            x, horizon = local.gather.cut(starts, columns)
        return fields.assemble(x, horizon, series if fields.series else None,
                               targets=targets, norm=local.normalizer)

    def held_positions_at(self, epoch: int, where: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Where the windows at epoch positions ``where`` of epoch ``epoch``
        start in :meth:`held_rows`' rows, and their series (int32): what the
        ``tf.data`` reader cuts in the graph."""
        _, starts, series = self._starts_at(epoch, where)
        return self.held_rows().positions(starts), series.astype(np.int32, copy=False)

    def _starts_at(self, epoch: int, where: np.ndarray) -> tuple[_Local, np.ndarray, np.ndarray]:
        """This process's state, and the global start rows and series of the
        windows at epoch positions ``where``."""
        self._this_process()
        self._check_store(epoch)
        local = self._process_local()
        positions = self._sequence(local, epoch).positions(epoch, where)
        return local, *self.plan.whole_split.global_starts_and_series(positions)

    # -- saved positions -------------------------------------------------------------
    def position_after(self, epoch: int, batches: int) -> dict[str, Any]:
        """Where epoch ``epoch`` stands once every shard has read ``batches``
        batches of it: a small JSON-able dict, for :meth:`resume` on any
        number of shards (and any batch size)."""
        done = max(0, check_int("batches", batches, 0) - self.lead_in(epoch))
        read = min(done * self.batch_size, self.windows_in(epoch))
        position = self.state_at(epoch)
        position["stops"].append([self.plan.shard_share.count, read])
        del position["lead"]  # counted in the stop
        return position

    def resume(self, position: dict[str, Any], *, lead: int = 0) -> int:
        """Go on from a saved :meth:`position_after` (saved with any number of
        shards): its epoch yields, over this plan's shards, every window it had
        left exactly once (counted after ``lead`` batches it does not yield);
        later epochs are whole. Returns the epoch. A position saved for another
        store, split, seed or shuffle is one line."""
        if not isinstance(position, dict) or "epoch" not in position or "stops" not in position:
            raise InvalidSpecError("not a windowkit position: pass what position_after() "
                                   "returned")
        check_saved_for(position, self.identity(), _POSITION_KEYS)
        epoch = check_epoch(position["epoch"])
        plan = self.plan
        total, share = plan.whole_split.total, plan.shard_share
        stops = checked_stops(position["stops"], total)
        self.adopt_order(saved_order(position))
        local = self._process_local()
        left = windows_left(lambda where: local.full(epoch, where), total, list(stops))
        if len(left) == 0 and lead == 0:
            self._resumed = None
            return epoch + 1
        mine = ShardShare.of_windows(left, share.count, share.index, total)
        self._resumed = _Resumed(epoch, stops, mine, lead)
        if self.holds_rows and mine.owned is not None and mine.size:  # hold what is left too
            first = min(share.lo, int(mine.owned[0]))
            last = max(share.hi, int(mine.owned[-1]) + 1)
            self._rows_plan = replace(plan, runs=plan.whole_split.select_positions(first, last))
            with self._lock:
                self._held = None
            self.hold()
        return epoch

    def state_at(self, epoch: int) -> dict[str, Any]:
        """What a framework's own checkpoint saves while epoch ``epoch`` is read
        (it counts the batches done itself): the epoch, the stops of a resume
        within it, the order and what the reader is for."""
        resumed = self._resumed
        stops = resumed.stops if resumed is not None and resumed.epoch == epoch else ()
        return {"epoch": int(epoch), "stops": [[s.num_shards, s.windows] for s in stops],
                "lead": self.lead_in(epoch), **self.identity()}

    def restore_state(self, state: object, keys: tuple[str, ...], *, what: str) -> int:
        """Go on from a :meth:`state_at` (checked on ``keys``, the order adopted):
        its epoch as it was, resumed part-way again if it was. Returns the epoch."""
        check_saved_for(state, self.identity(), keys, what=what)
        assert isinstance(state, dict)
        epoch = check_epoch(state.get("epoch"))
        lead = saved_lead(state, self.plan.whole_split.total)
        if state.get("stops") or lead:
            return self.resume({**state, "epoch": epoch}, lead=lead)
        self.adopt_order(saved_order(state, what=what))
        self._resumed = None
        return epoch

    def regroup(self, state: dict[str, Any], keys: tuple[str, ...], given: int) -> int:
        """Go on from a :meth:`state_at` saved with another number of shards
        (checked on ``keys``), after each of them had been given ``given``
        batches of its epoch, as the saved reader counted them: the windows
        they had not read, spread over this plan's shards and counted on from
        batch ``given`` (the count a trainer restores with the state). Returns
        the epoch."""
        check_saved_for(state, self.identity(), keys, what="state")
        position = regrouped(state, given, self.batch_size, self.plan.whole_split.total)
        return self.resume(position, lead=int(given))

    def identity(self) -> dict[str, Any]:
        """What a saved position of this reader is for."""
        return saved_for(self.plan, self.batch, self.order, self.epoch_order)



class _EpochCache:
    """The split's order of the latest epoch asked for (threads share it)."""

    def __init__(self, order: WindowOrder) -> None:
        self.order = order
        self._current: tuple[int, EpochOrder] | None = None

    def positions(self, epoch: int, where: np.ndarray) -> np.ndarray:
        current = self._current
        if current is None or current[0] != epoch:
            current = (epoch, self.order.epoch(epoch))
            self._current = current
        return current[1].positions_at(where)
