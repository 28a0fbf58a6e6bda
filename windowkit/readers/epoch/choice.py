"""How a reader shuffles a plan: the options (:class:`ShuffleOptions`) and the
plan's size decide the mode (:class:`ShuffleChoice`) and the blocks a group
holds (:func:`group_size`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from windowkit.readers.epoch.sampler import default_group
from windowkit.readers.epoch.saved import order_name
from windowkit.readers.options import check_shuffle, default_memory_budget

if TYPE_CHECKING:
    from windowkit.readers.options import ShuffleOptions
    from windowkit.readers.plan import ReadPlan


@dataclass(frozen=True)
class ShuffleChoice:
    """How a reader shuffles, and the bytes it may hold.

    ``mode``: ``"uniform"`` (a uniform permutation each epoch, rows held once,
    in memory or spilled), ``"blocks"`` (block groups, as large as the budget
    holds) or ``"ordered"`` (index order)."""

    mode: str
    memory_budget: int
    cache_bytes: int

    @property
    def uniform(self) -> bool:
        """Uniform, the rows held once (:class:`windowkit.readers.rows.held.HeldRows`)."""
        return self.mode == "uniform"

    @property
    def grouped(self) -> bool:
        """Read as groups of blocks."""
        return self.mode == "blocks"


def choose_shuffle(plan: ReadPlan, shuffle: bool | str, *, memory_budget: int | None = None,
                   cache_bytes: int | None = None, shuffle_blocks: int | None = None
                   ) -> ShuffleChoice:
    """``True``: uniform when the split's rows fit ``memory_budget`` (default:
    :func:`default_memory_budget`), else block groups sized by it;
    ``"global"``: uniform at any size (beyond the budget, spilled to local
    disk); ``"blocks"``: block groups; ``False``: index order. ``cache_bytes``
    or ``shuffle_blocks`` (experts) size block groups apart from the budget,
    and so ask ``True`` for block groups. A shard's budget covers its own rows."""
    shuffle = check_shuffle(shuffle)
    budget = default_memory_budget() if memory_budget is None else memory_budget
    groups = budget if cache_bytes is None else cache_bytes
    rows = plan.rows_bytes()
    experts = cache_bytes is not None or shuffle_blocks is not None  # they size groups
    if shuffle is False:
        mode = "ordered"
    elif shuffle == "blocks" or (shuffle is True and experts):
        mode = "blocks"
    elif shuffle == "global" or rows <= budget:
        mode = "uniform"
    else:
        mode = "blocks"
    return ShuffleChoice(mode, budget, groups)


def shuffle_choice(plan: ReadPlan, order: ShuffleOptions) -> ShuffleChoice:
    """How ``plan`` is shuffled with the options ``order`` (:func:`choose_shuffle`)."""
    return choose_shuffle(plan, order.shuffle, memory_budget=order.memory_budget,
                          cache_bytes=order.cache_bytes, shuffle_blocks=order.shuffle_blocks)


def group_size(plan: ReadPlan, shuffle_blocks: int | None, *, cache_bytes: int) -> int:
    """Blocks a group holds for ``plan``'s split, the same in every reader and
    every shard (:func:`windowkit.readers.epoch.sampler.default_group` over the whole split's
    blocks)."""
    layout = plan.layout
    return default_group(shuffle_blocks, cache_bytes=cache_bytes,
                         block_bytes=(layout.block_rows + plan.spec.span - 1) * layout.row_bytes,
                         num_blocks=int(np.count_nonzero(plan.split_windows_per_block())))


def epoch_order(plan: ReadPlan, order: ShuffleOptions, choice: ShuffleChoice) -> str:
    """The epoch order a reader of ``plan`` built with ``order`` follows
    (:func:`windowkit.readers.epoch.saved.order_name`): what its saved positions carry."""
    group = (group_size(plan, order.shuffle_blocks, cache_bytes=choice.cache_bytes)
             if choice.grouped else 1)
    return order_name(choice.mode, group)
