"""The readers' options, checked once, as three small frozen values.

``Store.tf_dataset(...)`` and ``Store.keras_dataset(...)`` take plain keyword
arguments (documented there); they check them into these values, and the
readers take the values, not a dozen keywords each:

- :class:`BatchOptions`: what a batch holds;
- :class:`ShuffleOptions`: the order of the windows and the memory it may take;
- :class:`ShardOptions`: which share of the split this reader reads.

:func:`choose_shuffle` turns the shuffle options and a plan into what the
reader does (:class:`ShuffleChoice`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import psutil

from windowkit.errors import InvalidSpecError, check_bool, check_int

if TYPE_CHECKING:
    from windowkit.readers.plan import ReadPlan

SHUFFLES = (True, False, "global", "blocks")
BUDGET_SHARE = 4  # the default memory budget: a quarter of the available memory ...
BUDGET_CAP = 16 << 30  # ... at most this
BUDGET_FLOOR = 256 << 20  # ... at least this


def default_memory_budget() -> int:
    """Bytes of rows a reader may hold when not told: a quarter of the memory
    available now, between 256 MiB and 16 GiB."""
    available = int(psutil.virtual_memory().available)
    return int(min(BUDGET_CAP, max(BUDGET_FLOOR, available // BUDGET_SHARE)))


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


@dataclass(frozen=True)
class ShuffleChoice:
    """How a reader shuffles, and the bytes it may hold.

    ``mode``: ``"uniform"`` (a uniform permutation each epoch, rows held once,
    in memory or spilled), ``"whole"`` (uniform too: one group of every
    block), ``"blocks"`` (block groups, as large as the budget holds) or
    ``"ordered"`` (index order)."""

    mode: str
    memory_budget: int
    cache_bytes: int

    @property
    def uniform(self) -> bool:
        """Uniform, the rows held once (:class:`windowkit.readers.numpy_engine.held.HeldRows`)."""
        return self.mode == "uniform"

    @property
    def grouped(self) -> bool:
        """Read as groups of blocks (one group of every block when ``"whole"``)."""
        return self.mode in ("whole", "blocks")


def choose_shuffle(plan: ReadPlan, shuffle: bool | str, *, memory_budget: int | None = None,
                   cache_bytes: int | None = None, shuffle_blocks: int | None = None
                   ) -> ShuffleChoice:
    """``True``: uniform when the split's rows fit ``memory_budget`` (default:
    :func:`default_memory_budget`), else block groups sized by it;
    ``"global"``: uniform at any size (beyond the budget, spilled to local
    disk); ``"blocks"``: block groups; ``False``: index order. ``cache_bytes``
    or ``shuffle_blocks`` (experts) size block groups apart from the budget,
    and so ask ``True`` for block groups.

    A uniform split whose rows fit the budget ``GROUP_SHARE`` times over
    (read-ahead, decoding, cutting) is read as one group of every block
    (``"whole"``): each epoch the same uniform permutation of its windows, cut
    in the graph, the fastest way. A shard's budget covers its own rows."""
    from windowkit.sampler import GROUP_SHARE

    shuffle = check_shuffle(shuffle)
    budget = default_memory_budget() if memory_budget is None else memory_budget
    groups = budget if cache_bytes is None else cache_bytes
    rows = plan.rows_bytes()
    experts = cache_bytes is not None or shuffle_blocks is not None  # they size groups
    if shuffle is False:
        mode = "ordered"
    elif shuffle == "blocks" or (shuffle is True and experts):
        mode = "blocks"
    elif rows * GROUP_SHARE <= budget:
        mode = "whole"
    elif shuffle == "global" or rows <= budget:
        mode = "uniform"
    else:
        mode = "blocks"
    return ShuffleChoice(mode, budget, groups)


@dataclass(frozen=True)
class BatchOptions:
    """What each batch holds: ``batch_size`` windows (the last batch of an
    epoch smaller unless ``drop_remainder``), normalized with the training
    rows' statistics when ``normalize``, with each window's series id when
    ``return_series``."""

    batch_size: int = 256
    drop_remainder: bool = False
    normalize: bool = False
    return_series: bool = False

    @classmethod
    def checked(cls, batch_size: object = 256, *, drop_remainder: object = False,
                normalize: object = False, return_series: object = False) -> BatchOptions:
        return cls(check_int("batch_size", batch_size, 1),
                   check_bool("drop_remainder", drop_remainder),
                   check_bool("normalize", normalize),
                   check_bool("return_series", return_series))


@dataclass(frozen=True)
class ShuffleOptions:
    """The order of the windows (``shuffle``: one of :data:`SHUFFLES`, each
    epoch's order fixed by ``seed``) and the memory it may take
    (``memory_budget`` bytes, default a quarter of the available memory; rows
    beyond it spilled to ``spill_dir``). Experts: ``cache_bytes`` and
    ``shuffle_blocks`` size block groups apart from the budget."""

    shuffle: bool | str = True
    seed: int = 0
    memory_budget: int | None = None
    spill_dir: str | os.PathLike[str] | None = None
    cache_bytes: int | None = None
    shuffle_blocks: int | None = None

    @classmethod
    def checked(cls, shuffle: object = True, *, seed: object = 0,
                memory_budget: object = None,
                spill_dir: str | os.PathLike[str] | None = None,
                cache_bytes: object = None, shuffle_blocks: object = None) -> ShuffleOptions:
        return cls(check_shuffle(shuffle), check_int("seed", seed, 0),
                   check_budget("memory_budget", memory_budget), spill_dir,
                   check_budget("cache_bytes", cache_bytes),
                   None if shuffle_blocks is None else check_int("shuffle_blocks",
                                                                 shuffle_blocks, 1))

    def choose(self, plan: ReadPlan) -> ShuffleChoice:
        """How ``plan`` is shuffled with these options (:func:`choose_shuffle`)."""
        return choose_shuffle(plan, self.shuffle, memory_budget=self.memory_budget,
                              cache_bytes=self.cache_bytes,
                              shuffle_blocks=self.shuffle_blocks)


@dataclass(frozen=True)
class ShardOptions:
    """Shard ``shard_index`` of ``num_shards`` of the split (``(0, 1)``: all of it)."""

    num_shards: int = 1
    shard_index: int = 0

    @classmethod
    def checked(cls, num_shards: object = None, shard_index: object = None, *,
                input_context: Any = None) -> ShardOptions:
        """From the readers' arguments: both shard numbers or neither, or a
        ``tf.distribute.InputContext`` instead."""
        if input_context is not None:
            if num_shards is not None or shard_index is not None:
                raise InvalidSpecError("pass input_context or num_shards/shard_index, not both")
            num_shards = int(input_context.num_input_pipelines)
            shard_index = int(input_context.input_pipeline_id)
        if num_shards is None and shard_index is None:
            return cls()
        if num_shards is None or shard_index is None:
            raise InvalidSpecError("num_shards and shard_index go together")
        count = check_int("num_shards", num_shards, 1)
        index = check_int("shard_index", shard_index, 0)
        if index >= count:
            raise InvalidSpecError(f"shard_index must be in 0..{count - 1}, got {index}")
        return cls(count, index)

    @property
    def whole(self) -> bool:
        return self.num_shards == 1


#: What a saved position is for: restored into a reader built otherwise, it
#: would lose windows and read others twice
SAVED_FOR_KEYS = ("store_id", "split", "seed", "shuffle", "mode", "batch_size",
                  "drop_remainder", "num_shards", "shard")


def saved_for(plan: ReadPlan, batch: BatchOptions, order: ShuffleOptions, mode: str
              ) -> dict[str, Any]:
    """What a saved position of a reader of ``plan`` is for (JSON-able)."""
    share = plan.shard_share
    return {"store_id": plan.store.store_id, "split": plan.split, "seed": order.seed,
            "shuffle": order.shuffle, "mode": mode, "batch_size": batch.batch_size,
            "drop_remainder": batch.drop_remainder, "num_shards": share.count,
            "shard": share.index}


def check_saved_for(saved: object, reader: dict[str, Any], keys: tuple[str, ...], *,
                    what: str = "position") -> None:
    """One line, naming the first of ``keys`` where the ``saved`` position's
    reader differs from this ``reader`` (also when it says nothing of it)."""
    if not isinstance(saved, dict):
        raise InvalidSpecError(f"the saved {what} is not a windowkit {what} (a dict, "
                               f"got {type(saved).__name__})")
    for key in keys:
        if key not in saved:
            raise InvalidSpecError(f"the saved {what} does not say which {key} it is for: "
                                   "it was not saved by this windowkit reader")
        if saved[key] != reader[key]:
            raise InvalidSpecError(
                f"the saved {what} is for {key}={saved[key]!r}, this reader has "
                f"{key}={reader[key]!r}: build the reader as it was when it was saved")
