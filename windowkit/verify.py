"""``windowkit verify``: re-check a store against its manifest.

The manifest must pass the schema every reader checks (types, ranges, paths
inside the store, no links); every file it lists must exist with its recorded
size and SHA-256, and no other file may be there; the data must hold the
manifest's rows and every index table's windows must lie inside their series.
Nothing is written, and no link is followed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from windowkit._progress import progress_bar
from windowkit.conversion import walk_files
from windowkit.errors import WindowkitError
from windowkit.formats import get_format
from windowkit.location import is_remote, list_objects, resolve
from windowkit.manifest import CHECKSUM, MANIFEST_NAME, Manifest, file_digest


def _walk(root: Path) -> list[tuple[str, bool]]:
    """Every file under ``root``, relative, and whether it is a link (object
    storage has none)."""
    if not is_remote(root):
        return list(walk_files(root))
    return [(name, False) for name in sorted(list_objects(root))]


def verify_store(path: str | os.PathLike[str], *, progress: bool = False,
                 storage_options: dict[str, Any] | None = None) -> list[str]:
    """Problems found in the store at ``path`` (a directory or a URL), one line
    each naming the file (an empty list: the store is intact)."""
    from windowkit.store import open_store

    root = resolve(path, storage_options)
    try:
        manifest = Manifest.read(root)
    except WindowkitError as exc:
        return [str(exc)]
    problems: list[str] = []
    listed = {entry.path: entry for entry in manifest.files}
    present = set()
    for relative, is_link in _walk(root):
        if is_link:
            problems.append(f"{root / relative}: is a symbolic link (a store holds none)")
        elif relative != MANIFEST_NAME:
            present.add(relative)
    for extra in sorted(present - set(listed)):
        problems.append(f"{root / extra}: file is not in the manifest")
    total = sum(entry.bytes for entry in manifest.files)
    with progress_bar(total=total, desc="verify", enabled=progress) as bar:
        for name, entry in sorted(listed.items()):
            file = root / name
            if name not in present:
                problems.append(f"{file}: file is missing")
                bar.update(entry.bytes)
                continue
            size = file.stat().st_size
            if size != entry.bytes:
                problems.append(f"{file}: holds {size} bytes, manifest says {entry.bytes}")
                bar.update(entry.bytes)
                continue
            if file_digest(file, bar.update) != entry.sha256:
                problems.append(f"{file}: checksum differs from the manifest ({CHECKSUM})")
    if problems:  # the structure checks below read the files just found damaged
        return problems
    try:
        rows = get_format(manifest.format).stored_rows(root, manifest.data)
        if rows != manifest.total_rows:
            problems.append(f"{root / 'data'}: holds {rows} rows, manifest says "
                            f"{manifest.total_rows}")
        store = open_store(root)  # already resolved: keeps its storage options
        for split in store.splits:
            store.runs(split)  # checks every window lies inside its series, and the count
    except (WindowkitError, OSError, ValueError) as exc:
        problems.append(str(exc))
    return problems
