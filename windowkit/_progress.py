"""Progress bars on stderr (tqdm), silent when asked or when not a terminal, and
sizes for people to read."""

from __future__ import annotations

import sys
from typing import Any

from tqdm.auto import tqdm


def progress_bar(*, total: int, desc: str, enabled: bool, unit: str = "B") -> Any:
    # disable=None: tqdm shows nothing when stderr is not a terminal
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=True, unit_divisor=1024,
                disable=True if not enabled else None, file=sys.stderr, leave=False,
                dynamic_ncols=True)


def human_size(size: float) -> str:
    """``size`` bytes as ``512 B``, ``1.5 KiB``, ... ``2.0 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.1f} {unit}" if unit != "B" else f"{int(size)} B"
        size /= 1024
    return f"{size:.1f} TiB"  # pragma: no cover
