"""Walking a local directory without following links, for both sides that must
see every file of a store: a conversion's workspace and target checks (what
windowkit did not write) and ``windowkit verify`` (no file the manifest does
not list). It lives here so that verify does not depend on conversion."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path


def walk_files(root: Path) -> Iterable[tuple[str, bool]]:
    """``(relative path, is a link)`` of every file and link under ``root``,
    never descending into a linked directory."""
    for directory, dirs, names in os.walk(root):
        for name in [*names, *(d for d in dirs if os.path.islink(os.path.join(directory, d)))]:
            full = os.path.join(directory, name)
            yield os.path.relpath(full, root).replace(os.sep, "/"), os.path.islink(full)
