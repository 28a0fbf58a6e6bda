"""What a reader's saved position (or state, or checkpoint) is for, and the
one-line check that it is restored into a reader built the same way."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from windowkit.errors import InvalidSpecError

if TYPE_CHECKING:
    from windowkit.readers.options import BatchOptions, ShuffleOptions
    from windowkit.readers.plan import ReadPlan

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
