"""The window specification shared by every format and reader."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from windowkit.errors import check_int


@dataclass(frozen=True)
class WindowSpec:
    """Which windows a series yields.

    For a series of ``n`` rows the window starts are
    ``range(0, n - (length + horizon - 1) * sampling_rate, stride)``; a window
    starting at row ``r`` has inputs ``r, r+R, ..., r+(L-1)R`` and, when
    ``horizon > 0``, targets ``r+L*R, ..., r+(L+H-1)*R``. With ``horizon=0`` this
    is exactly ``keras.utils.timeseries_dataset_from_array`` applied per series.
    """

    length: int
    stride: int = 1
    sampling_rate: int = 1
    horizon: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "length", check_int("window length", self.length, 1))
        object.__setattr__(self, "stride", check_int("stride", self.stride, 1))
        object.__setattr__(
            self, "sampling_rate", check_int("sampling rate", self.sampling_rate, 1)
        )
        object.__setattr__(self, "horizon", check_int("horizon", self.horizon, 0))

    @property
    def steps(self) -> int:
        """Rows a window reads: inputs plus targets."""
        return self.length + self.horizon

    @property
    def span(self) -> int:
        """Consecutive source rows a window covers, first to last inclusive."""
        return (self.steps - 1) * self.sampling_rate + 1

    def num_windows(self, rows: int) -> int:
        """Number of windows a series of ``rows`` rows yields (0 if too short)."""
        usable = rows - (self.steps - 1) * self.sampling_rate
        return 0 if usable <= 0 else -(-usable // self.stride)

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WindowSpec:
        return cls(**{k: data[k] for k in ("length", "stride", "sampling_rate", "horizon")})
