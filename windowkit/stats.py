"""Per-column statistics accumulated in float64 while streaming rows.

A *column* is an entry of the first step axis: a feature of a vector step
``[F]``, a channel of a ``[C, H, W]`` frame, or the single value of a scalar step.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np


def _per_column(block: np.ndarray) -> np.ndarray:
    """View ``block`` as ``[values, columns]``."""
    if block.ndim == 1:
        return block.reshape(-1, 1)
    moved = np.moveaxis(block, 1, -1)
    return moved.reshape(-1, block.shape[1])


class RunningStats:
    """Mean, std, min and max per column, merged block by block (Chan et al.)."""

    def __init__(self) -> None:
        self.count = 0
        self.mean: np.ndarray | None = None
        self.m2: np.ndarray | None = None
        self.min: np.ndarray | None = None
        self.max: np.ndarray | None = None

    def update(self, block: np.ndarray) -> None:
        values = _per_column(block).astype(np.float64)
        if values.shape[0] == 0:
            return
        mean = values.mean(axis=0)
        part = RunningStats()
        part.count, part.mean = values.shape[0], mean
        part.m2 = ((values - mean) ** 2).sum(axis=0)
        part.min, part.max = values.min(axis=0), values.max(axis=0)
        self.merge(part)

    def merge(self, other: RunningStats) -> None:
        """Fold in statistics of other rows (Chan et al.'s pairwise update)."""
        if other.mean is None or other.m2 is None or other.min is None or other.max is None:
            return
        if self.mean is None or self.m2 is None or self.min is None or self.max is None:
            self.count, self.mean, self.m2 = other.count, other.mean, other.m2
            self.min, self.max = other.min, other.max
            return
        n, total = other.count, self.count + other.count
        delta = other.mean - self.mean
        self.mean = self.mean + delta * (n / total)
        self.m2 = self.m2 + other.m2 + delta**2 * (self.count * n / total)
        self.min, self.max = np.minimum(self.min, other.min), np.maximum(self.max, other.max)
        self.count = total

    def state(self) -> dict[str, Any] | None:
        """Exact state, JSON-able (Python floats round-trip exactly)."""
        if self.mean is None or self.m2 is None or self.min is None or self.max is None:
            return None
        return {"count": self.count, "mean": self.mean.tolist(), "m2": self.m2.tolist(),
                "min": self.min.tolist(), "max": self.max.tolist()}

    @classmethod
    def from_state(cls, state: dict[str, Any] | None) -> RunningStats:
        stats = cls()
        if state is not None:
            stats.count = int(state["count"])
            stats.mean, stats.m2, stats.min, stats.max = (
                np.asarray(state[k], dtype=np.float64) for k in ("mean", "m2", "min", "max"))
        return stats

    def to_dict(self) -> dict[str, Any] | None:
        """Count, mean, std, min and max per column; None without rows, or when
        they overflow float64 (values near its largest): never a NaN or inf."""
        if self.mean is None or self.m2 is None or self.min is None or self.max is None:
            return None
        std = np.sqrt(self.m2 / self.count)
        if not (np.isfinite(std).all() and np.isfinite(self.mean).all()):
            return None
        return {
            "count": self.count,
            "mean": self.mean.tolist(),
            "std": std.tolist(),
            "min": self.min.tolist(),
            "max": self.max.tolist(),
        }


class Normalizer:
    """Applies ``(x - mean) / std`` per column; a constant column only shifts."""

    def __init__(self, stats: dict[str, Any], *, step_shape: tuple[int, ...],
                 dtype: np.dtype) -> None:
        self.dtype = np.dtype(np.float64 if dtype == np.float64 else np.float32)
        shape = (-1,) + (1,) * (len(step_shape) - 1) if step_shape else ()
        mean = np.asarray(stats["mean"], dtype=np.float64)
        std = np.asarray(stats["std"], dtype=np.float64)
        std = np.where(std > 0, std, 1.0)
        self.mean = mean.reshape(shape).astype(self.dtype)
        self.scale = (1.0 / std).reshape(shape).astype(self.dtype)

    def select(self, columns: np.ndarray | None) -> Normalizer:
        """This normalizer for ``columns`` only (the target columns), or itself."""
        if columns is None:
            return self
        chosen = copy.copy(self)
        chosen.mean, chosen.scale = self.mean[columns], self.scale[columns]
        return chosen

    def __call__(self, values: np.ndarray) -> np.ndarray:
        out = values.astype(self.dtype)
        out -= self.mean
        out *= self.scale
        return out
