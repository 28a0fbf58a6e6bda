"""File-system helpers of a conversion's local writes: durable (fsync'd) files
and records, an exclusive lock on a directory opened without following links,
and whether finished files are still the ones recorded. They hold no policy
and no lifecycle (what may be written where, and the workspace: :mod:`._target`)."""

from __future__ import annotations

import fcntl
import json
import os
import stat
from pathlib import Path
from typing import Any

from windowkit.manifest import FileEntry


def fsync(path: Path) -> None:
    """Flush a file's or a directory's (its entries') writes to disk."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | (os.O_DIRECTORY if path.is_dir() else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """Flush every file and directory under ``root`` (``root`` included)."""
    for directory, _, names in os.walk(root):
        for name in names:
            fsync(Path(directory) / name)
        fsync(Path(directory))


def write_json_durably(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` to ``path`` whole or not at all, and on disk when this returns."""
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as fh:
        json.dump(payload, fh, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync(path.parent)


def lock_directory(path: Path) -> int | None:
    """Open the directory ``path`` (never through a link: ``ELOOP`` or ``ENOTDIR``
    is raised) and lock it exclusively; its descriptor, or None when another
    process holds the lock. The kernel drops the lock when the process dies."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def files_match(root: Path, entries: list[FileEntry]) -> bool:
    """Whether every file exists with its recorded size and SHA-256. A missing or
    damaged file is ``False``; any other read error is raised (a transient error
    must not make finished work look damaged)."""
    for entry in entries:
        path = root / entry.path
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            return False
        if not stat.S_ISREG(info.st_mode) or info.st_size != entry.bytes:
            return False
        if FileEntry.of(root, entry.path).sha256 != entry.sha256:
            return False
    return True
