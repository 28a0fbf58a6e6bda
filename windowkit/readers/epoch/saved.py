"""What a reader's saved position (or state, or checkpoint) is for, and the
one-line check that it is restored into a reader built the same way.

A saved position names the epoch order it was saved in (``order``: ``"index"``,
``"uniform"`` or ``"blocks:G"``, block groups of ``G`` blocks). With
``shuffle=True`` that order follows the memory budget of the machine that
built the reader (uniform when the split's rows fit it, else block groups as
large as it holds), so it travels with every saved state: a reader that
restores one goes on in the saved order (the NumPy readers adopt it, see
:meth:`windowkit.readers.epoch.batches.EpochBatches.adopt_order`), or
says in one line how to build it so (``tf.data``, whose order is its graph).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from windowkit.errors import InvalidSpecError, check_int

if TYPE_CHECKING:
    from windowkit.readers.options import BatchOptions, ShuffleOptions
    from windowkit.readers.plan import ReadPlan

#: What a saved position is for: restored into a reader built otherwise, it
#: would lose windows and read others twice
SAVED_FOR_KEYS = ("store_id", "split", "seed", "shuffle", "order", "batch_size",
                  "drop_remainder", "num_shards", "shard")
#: What a reader that adopts the saved order checks (the order is taken over)
ADOPTING_KEYS = tuple(key for key in SAVED_FOR_KEYS if key != "order")
#: What a ``tf.data`` checkpoint must match: the order itself, whichever
#: ``shuffle`` option chose it (its graph cannot adopt another)
GRAPH_KEYS = tuple(key for key in SAVED_FOR_KEYS if key != "shuffle")

#: epochs are numbered below this (what a saved position may name)
EPOCH_LIMIT = 2**31

_BLOCKS = re.compile(r"blocks:([1-9][0-9]{0,9})")
#: the orders a saved position may name, besides "blocks:G"
ORDERS = ("index", "uniform")


def check_epoch(value: object) -> int:
    """``value`` as an epoch number (an integer in ``0 .. EPOCH_LIMIT - 1``), else one line."""
    epoch = check_int("epoch", value, 0)
    if epoch >= EPOCH_LIMIT:
        raise InvalidSpecError(f"epoch must be below {EPOCH_LIMIT}, got {epoch}")
    return epoch


def order_name(mode: str, group: int) -> str:
    """The epoch order of a reader whose shuffle ``mode`` is ``"ordered"``,
    ``"uniform"`` or ``"blocks"`` (with groups of ``group`` blocks)."""
    if mode == "blocks":
        return f"blocks:{group}"
    return "index" if mode == "ordered" else "uniform"


def check_order(value: object, *, what: str = "position") -> str:
    """``value`` if it names an epoch order (:func:`order_name`), else one line."""
    if isinstance(value, str) and (value in ORDERS or _BLOCKS.fullmatch(value)):
        return value
    raise InvalidSpecError(f"the saved {what}'s order must be 'index', 'uniform' or "
                           f"'blocks:G' (G blocks a group), got {value!r}")


def group_of(order: str) -> int:
    """The blocks a group holds in the order ``order`` (1 unless block groups)."""
    found = _BLOCKS.fullmatch(order)
    return int(found.group(1)) if found else 1


def saved_for(plan: ReadPlan, batch: BatchOptions, order: ShuffleOptions, epoch_order: str
              ) -> dict[str, Any]:
    """What a saved position of a reader of ``plan`` is for (JSON-able)."""
    share = plan.shard_share
    return {"store_id": plan.store.store_id, "split": plan.split, "seed": order.seed,
            "shuffle": order.shuffle, "order": epoch_order, "batch_size": batch.batch_size,
            "drop_remainder": batch.drop_remainder, "num_shards": share.count,
            "shard": share.index}


def saved_order(saved: dict[str, Any], *, what: str = "position") -> str:
    """The epoch order a saved position names; one saved before orders were
    named says its mode instead, which names the order unless block groups."""
    if "order" not in saved and saved.get("mode") in ("ordered", "uniform"):
        return order_name(str(saved["mode"]), 1)
    if "order" not in saved:
        raise InvalidSpecError(f"the saved {what} does not say which order it is for: "
                               "it was not saved by this windowkit reader")
    return check_order(saved["order"], what=what)


_MISSING = object()


def check_saved_for(saved: object, reader: dict[str, Any], keys: tuple[str, ...], *,
                    what: str = "position") -> None:
    """One line, naming the first of ``keys`` where the ``saved`` position's
    reader differs from this ``reader`` (also when it says nothing of it)."""
    if not isinstance(saved, dict):
        raise InvalidSpecError(f"the saved {what} is not a windowkit {what} (a dict, "
                               f"got {type(saved).__name__})")
    for key in keys:
        value = saved_order(saved, what=what) if key == "order" else saved.get(key, _MISSING)
        if value is _MISSING:
            raise InvalidSpecError(f"the saved {what} does not say which {key} it is for: "
                                   "it was not saved by this windowkit reader")
        if value != reader[key]:
            raise InvalidSpecError(
                f"the saved {what} is for {key}={value!r}, this reader has "
                f"{key}={reader[key]!r}: {_rebuild_hint(key, value)}")


def _rebuild_hint(key: str, value: object) -> str:
    """How to build a reader that takes a saved position of ``key=value``."""
    if key != "order":
        return "build the reader as it was when it was saved"
    if value == "uniform":
        return "build the reader with shuffle='global' (the same uniform order at any budget)"
    if value == "index":
        return "build the reader with shuffle=False"
    return (f"build the reader with shuffle_blocks={group_of(str(value))} (its memory "
            "budget chose that group size where it was saved)")
