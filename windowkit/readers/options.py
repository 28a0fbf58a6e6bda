"""The readers' options, checked once, as three small frozen values.

``Store.tf_dataset(...)`` and ``Store.keras_dataset(...)`` take plain keyword
arguments (documented there); they check them into these values, and the
readers take the values, not a dozen keywords each:

- :class:`BatchOptions`: what a batch holds;
- :class:`ShuffleOptions`: the order of the windows and the memory it may take;
- :class:`ShardOptions`: which share of the split this reader reads.

How a plan is shuffled with them is :mod:`windowkit.readers.epoch.choice`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import psutil

from windowkit.errors import InvalidSpecError, check_bool, check_int

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
