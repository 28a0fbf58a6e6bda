"""Progress bars on stderr (tqdm), silent when asked or when not a terminal, and
sizes for people to read (humanize)."""

from __future__ import annotations

import sys
from typing import Any

import humanize
from tqdm.auto import tqdm


def progress_bar(*, total: int, desc: str, enabled: bool, unit: str = "B") -> Any:
    # disable=None: tqdm shows nothing when stderr is not a terminal
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=True, unit_divisor=1024,
                disable=True if not enabled else None, file=sys.stderr, leave=False,
                dynamic_ncols=True)


def human_size(size: float) -> str:
    """``size`` bytes as ``1000 Bytes``, ``1.5 KiB``, ... ``2.0 GiB``."""
    return str(humanize.naturalsize(size, binary=True))
