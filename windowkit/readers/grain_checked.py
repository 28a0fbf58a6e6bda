"""A Grain ``IterDataset`` over a :class:`~windowkit.readers.grain.BatchGrainSource`
whose iterator states say what they were saved for.

A plain ``MapDataset.source(src).to_iter_dataset()`` iterator's state is
Grain's alone (``{"next_index": n}``): restored into a source built with
another seed or batch size, it goes on at index ``n`` of other batches, and
nothing notices. :meth:`BatchGrainSource.iter_dataset` wraps that iterator:
its state is ``{"windowkit": what it was saved for, "grain": Grain's state}``;
``set_state`` checks the first (one line naming what differs), adopts the
saved epoch order (the order another machine's memory budget chose), then
hands Grain its part. Transforms after it (``.map``, ``.batch``,
``.mp_prefetch``) carry the state on as Grain's own iterators do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import grain

from windowkit.errors import InvalidSpecError
from windowkit.readers.epoch.saved import ADOPTING_KEYS, check_saved_for, saved_order

if TYPE_CHECKING:
    from windowkit.readers.epoch.batches import EpochBatches

#: what a state must match: the reader's keys, and which epochs the items hold
STATE_KEYS = (*ADOPTING_KEYS, "epoch", "epochs")


class BatchSource(Protocol):
    """What a checked iterator needs of its source (a
    :class:`~windowkit.readers.grain.BatchGrainSource`)."""

    batches: EpochBatches
    epoch: int
    epochs: int


class CheckedIterDataset(grain.IterDataset):
    """``parent`` (an iterable dataset over ``source``'s items), whose
    iterators save and check what their states are for."""

    def __init__(self, parent: grain.IterDataset, source: BatchSource) -> None:
        super().__init__(parent)
        self._source = source

    def __iter__(self) -> CheckedIterator:
        return CheckedIterator(self._parent.__iter__(), self._source)

    def __str__(self) -> str:
        return f"CheckedIterDataset({self._source!r})"


class CheckedIterator(grain.DatasetIterator):
    """Grain's iterator over a :class:`BatchGrainSource`, its state checked on restore."""

    def __init__(self, parent: grain.DatasetIterator, source: BatchSource) -> None:
        super().__init__(parent)
        self._source = source

    def __next__(self) -> Any:
        return next(self._parent)

    def saved_for(self) -> dict[str, Any]:
        """What this iterator's items depend on (JSON-able)."""
        source = self._source
        return {**source.batches.identity(), "epoch": source.epoch, "epochs": source.epochs}

    def get_state(self) -> dict[str, Any]:
        return {"windowkit": self.saved_for(), "grain": self._parent.get_state()}

    def set_state(self, state: dict[str, Any]) -> None:
        """Check what ``state`` was saved for (one line naming what differs),
        go on in its epoch order, and restore Grain's position."""
        if not isinstance(state, dict) or not isinstance(state.get("windowkit"), dict) \
                or "grain" not in state:
            raise InvalidSpecError("not a state of a windowkit Grain iterator (it has no "
                                   "'windowkit' and 'grain' parts): pass what get_state() "
                                   "returned by src.iter_dataset()'s iterator")
        saved = state["windowkit"]
        check_saved_for(saved, self.saved_for(), STATE_KEYS, what="state")
        self._source.batches.adopt_order(saved_order(saved, what="state"))
        self._parent.set_state(state["grain"])
