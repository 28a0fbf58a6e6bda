"""Walking a local directory, for both sides that must see every file of a
store: a conversion's workspace and target checks (what windowkit did not
write; links not followed) and ``windowkit verify`` (no file the manifest does
not list; links followed, as readers follow them). It lives here so that
verify does not depend on conversion."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path


def walk_files(root: Path, *, follow_links: bool = False) -> Iterable[tuple[str, bool]]:
    """``(relative path, is a link)`` of every file and link under ``root``.
    A linked directory is one entry, not descended into, unless
    ``follow_links``: then its files are listed under it (each real directory
    once, so a loop of links ends)."""
    seen: set[str] = set()
    for directory, dirs, names in os.walk(root, followlinks=follow_links):
        if follow_links:
            real = os.path.realpath(directory)
            if real in seen:
                dirs[:] = []
                continue
            seen.add(real)
            entries = names
        else:
            entries = [*names, *(d for d in dirs if os.path.islink(os.path.join(directory, d)))]
        for name in entries:
            full = os.path.join(directory, name)
            yield os.path.relpath(full, root).replace(os.sep, "/"), os.path.islink(full)
