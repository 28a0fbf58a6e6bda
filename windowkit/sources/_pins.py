"""Sources pinned for the length of a conversion.

Before a conversion reads a source file it records what the file is: for a
local file its identity (device and inode), size and modification time; for an
object its size and ETag. Before publishing, :meth:`SourcePins.check` looks
again: a file rewritten in place or replaced (a rename over it) meanwhile would
leave a store half old, half new, so the conversion stops with one line naming
the file instead, and publishes nothing.

Pinning also refuses what must never be opened for reading: a FIFO or a device
given as a source would block (or never end) instead of holding rows.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from typing import Any

from windowkit.errors import SourceChangedError, SourceError
from windowkit.location import as_url_path, is_url, remote_errors, resolve

_KINDS = {stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket"}
_CHANGED = ("; nothing was published and the workspace is kept: run the same command "
            "again to convert the source as it is now")


def check_regular(path: str) -> os.stat_result | None:
    """The ``stat`` of a local source path (None when it does not exist): a FIFO,
    device or socket is refused without opening it."""
    try:
        info = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    kind = _KINDS.get(stat.S_IFMT(info.st_mode))
    if kind is not None:
        raise SourceError(f"{path}: is {kind}, not a file; a source must be a regular "
                          "file (.npy, .csv or .parquet)")
    return info


def _local_state(path: str) -> tuple[Any, ...] | None:
    info = check_regular(path)
    if info is None or stat.S_ISDIR(info.st_mode):
        return None
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


def _remote_state(url: str) -> tuple[Any, ...] | None:
    location = as_url_path(resolve(url))
    with remote_errors(url, SourceError):
        location.fs.invalidate_cache(location.path)  # a cached listing is no answer
        try:
            info = location.fs.info(location.path)
        except FileNotFoundError:
            return None
    return (info.get("size"), info.get("ETag") or info.get("mtime"))


def _expand_url(path: str) -> list[str]:
    """A URL pattern's objects (a local path or a plain URL: itself)."""
    if not is_url(path) or not any(ch in path for ch in "*?["):
        return [path]
    location = as_url_path(resolve(path))
    with remote_errors(path, SourceError):
        return sorted(f"{location.protocol}://{name}"
                      for name in location.fs.glob(location.path))


def remote_version(url: str) -> str | None:
    """The object's ETag (else time, else size) now, as :class:`RemoteNpySeries`
    records it; None when it is gone or cannot be asked."""
    try:
        state = _remote_state(url)
    except SourceError:
        return None
    return None if state is None else str(state[1] or state[0])


def object_changed(url: str) -> SourceChangedError:
    return SourceChangedError(f"{url}: the source changed during the conversion (it was "
                              f"written again: its ETag changed){_CHANGED}")


def _describe(before: tuple[Any, ...], after: tuple[Any, ...] | None, remote: bool) -> str:
    if after is None:
        return "it was deleted"
    if remote:
        return (f"its size changed from {before[0]} to {after[0]} bytes" if before[0] != after[0]
                else "it was written again: its ETag changed")
    if before[:2] != after[:2]:
        return "it was replaced by another file"
    if before[2] != after[2]:
        return f"its size changed from {before[2]} to {after[2]} bytes"
    return "it was rewritten in place: its modification time changed"


@dataclass
class SourcePins:
    """What each source file was when the conversion started, by path or URL."""

    states: dict[str, tuple[Any, ...]] = field(default_factory=dict)

    @classmethod
    def of(cls, paths: list[str]) -> SourcePins:
        """Pin ``paths`` (local paths and URLs); missing ones are left to the
        source readers, which say so."""
        pins = cls()
        for path in dict.fromkeys(p for given in paths for p in _expand_url(given)):
            state = _remote_state(path) if is_url(path) else _local_state(path)
            if state is not None:
                pins.states[path] = state
        return pins

    def check(self) -> None:
        """Raise :class:`SourceChangedError` naming the first source file that is
        no longer what it was when pinned."""
        for path, before in self.states.items():
            remote = is_url(path)
            try:
                after = _remote_state(path) if remote else _local_state(path)
            except SourceError:
                after = None
            if after != before:
                raise SourceChangedError(f"{path}: the source changed during the conversion "
                                         f"({_describe(before, after, remote)}){_CHANGED}")


def changed_rows(where: str, part: int) -> SourceChangedError:
    """The error for a source whose rows read again differ from those written."""
    return SourceChangedError(f"{where}: the source changed during the conversion (the rows "
                              f"of part {part} read again differ from those written)"
                              f"{_CHANGED}")
