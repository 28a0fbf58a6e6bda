"""``windowkit verify``: re-check a store against its manifest.

The manifest must pass the schema every reader checks (types, ranges, paths
inside the store); every file it lists must exist with its recorded
size and SHA-256, and no other file may be there; the series table and every
index table must pass the checks readers apply (columns and types, each window
inside its series and its split's rows, of the store's length, sorted, each
once); and every storage block is decoded through the format's row reader, so
that its own checks (codec checksums, the block's digest, its rows' series and
positions) run on all of it, and on every halo (the rows after a block that
its windows reach) as readers read it (``fast=True`` skips the decoding). Nothing is
written. Links are followed as readers follow them (a store behind a symlink,
a DVC or git-annex checkout): each must lead to a regular file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from windowkit._progress import progress_bar
from windowkit._walk import walk_files
from windowkit.errors import NotAStoreError, StoreError, WindowkitError
from windowkit.formats import get_format
from windowkit.location import is_remote, list_objects, not_regular, resolve
from windowkit.manifest import CHECKSUM, MANIFEST_NAME, Manifest, file_digest

if TYPE_CHECKING:
    from windowkit.store import Store

DECODED_BYTES = 64 << 20  # rows decoded at a time


def _walk(root: Path) -> list[tuple[str, bool]]:
    """Every file under ``root`` (links followed, as readers follow them),
    relative, and whether it is a link (object storage has none)."""
    if not is_remote(root):
        return list(walk_files(root, follow_links=True))
    return [(name, False) for name in sorted(list_objects(root))]


def verify_store(path: str | os.PathLike[str], *, progress: bool = False, fast: bool = False,
                 storage_options: dict[str, Any] | None = None) -> list[str]:
    """Problems found in the store at ``path`` (a directory or a URL), one line
    each naming the file (an empty list: the store is intact). ``fast``: check
    the files' sizes and checksums and the tables, without decoding the data."""
    root = resolve(path, storage_options)
    try:
        manifest = Manifest.read(root)
    except NotAStoreError:
        raise  # nothing to verify: a user error, not a damaged store
    except WindowkitError as exc:
        return [str(exc)]
    problems = _check_files(root, manifest, progress)
    if problems:  # the structure checks below read the files just found damaged
        return problems
    try:
        _check_tables(root, manifest, progress=progress, decode=not fast)
    except (WindowkitError, OSError, ValueError, KeyError) as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        problems.append(message if message.startswith(str(root)) else f"{root}: {message}")
    return problems


def _check_files(root: Path, manifest: Manifest, progress: bool) -> list[str]:
    """Every listed file present with its size and checksum, and no other file."""
    problems: list[str] = []
    listed = dict(zip(manifest.file_keys(), manifest.files, strict=True))  # by key under root
    present = set()
    for relative, is_link in _walk(root):
        problem = _not_a_file(root / relative) if is_link else None
        if problem is not None:
            problems.append(problem)
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
    return problems


def _not_a_file(link: Path) -> str | None:
    """What is wrong with a link in a store (a DVC or git-annex checkout, a
    linked directory), or None when it leads to a regular file."""
    try:
        mode = os.stat(link).st_mode
    except OSError as exc:
        return f"{link}: is a link that leads to nothing readable ({exc.strerror or exc})"
    error = not_regular(link, mode)
    return None if error is None else str(error)


def _check_tables(root: Path, manifest: Manifest, *, progress: bool, decode: bool) -> None:
    """Raise the first problem of the data's row count, the series and index
    tables (as readers check them), the static features and, with ``decode``,
    any storage block."""
    from windowkit.store import Store

    data_root = manifest.data_root(root)
    rows = get_format(manifest.format).stored_rows(data_root, manifest.data)
    if rows != manifest.total_rows:
        raise StoreError(f"{data_root / 'data'}: holds {rows} rows, manifest says "
                         f"{manifest.total_rows}")
    store = Store(root)  # already resolved: keeps its storage options
    for split in store.splits:
        store.runs(split)  # every entry checked, and the count
    store.static_values  # noqa: B018 -- checks the static features
    if decode:
        _decode_all(store, manifest.total_rows, progress)


def _decode_all(store: Store, total: int, progress: bool) -> None:
    """Every block decoded and checked, with the halo after it: a read of
    several blocks that goes on into the next block's head, so that the rows a
    window reaches past its block are checked as a reader checks them."""
    reader, layout, halo = store.row_reader(), store.layout, store.spec.span - 1
    step = layout.block_rows * max(1, DECODED_BYTES // max(1, layout.block_rows * layout.row_bytes))
    with progress_bar(total=total, desc="decode", enabled=progress) as bar:
        for start in range(0, total, step):
            stop = min(start + step, total)
            reader.read_rows(start, min(total, stop + halo))
            bar.update(stop - start)
