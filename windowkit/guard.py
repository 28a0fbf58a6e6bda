"""Noticing a store replaced under a running reader (:class:`StoreGuard`), and the
manifest file's bytes read unvalidated, which is all the guard needs.

Readers open files lazily, long after the manifest was validated; a store
replaced meanwhile must be an error, never a mix of old and new files. The
guard compares only the store id, so this module sits below
:mod:`windowkit.manifest` (which validates those bytes) and imports none of
the schema: readers import the guard, never the manifest.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from windowkit.errors import (
    NotAStoreError,
    StoreError,
    StoreReplacedError,
    StoreUnreachableError,
)
from windowkit.location import (
    as_url_path,
    is_remote,
    not_regular,
    open_regular,
    remote_call,
    remote_errors,
)

MANIFEST_NAME = "windowkit.json"
MAX_MANIFEST_BYTES = 256 << 20


def read_manifest_bytes(root: Path) -> bytes:
    """The bytes of ``root/windowkit.json`` (a regular file, or a link to one)."""
    path = root / MANIFEST_NAME
    if is_remote(root):
        return _read_remote_manifest(root)
    if not root.exists():
        raise NotAStoreError(f"{root}: no such store")
    if not root.is_dir():
        raise NotAStoreError(f"{root}: is a file, not a windowkit store (a store is a "
                             "directory that windowkit convert writes)")
    try:
        info = os.stat(path)  # through a link (a DVC or git-annex checkout) too
    except FileNotFoundError:
        raise NotAStoreError(f"{root}: not a windowkit store (no {MANIFEST_NAME})") from None
    error = not_regular(path, info.st_mode)
    if error is not None:
        raise error
    fd = open_regular(path)  # never blocks: it may have been swapped for a FIFO since
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fd).st_size
        if size > MAX_MANIFEST_BYTES:
            raise StoreError(f"{path}: {size} bytes, larger than any manifest")
        return fh.read(MAX_MANIFEST_BYTES + 1)


def _read_remote_manifest(root: Path) -> bytes:
    """The manifest object's bytes (object storage has no links)."""
    path = root / MANIFEST_NAME
    key = as_url_path(path).path
    with remote_errors(root):
        try:
            size = int(remote_call(path, "info", key)["size"])
        except FileNotFoundError:
            incomplete = as_url_path(root / ".windowkit-incomplete")  # conversion._remote
            if remote_call(incomplete, "exists", incomplete.path):
                raise StoreError(f"{root}: not a windowkit store yet: a conversion is "
                                 "publishing one here (its manifest comes last); open it "
                                 "again when it finishes, or if none runs, run that convert "
                                 "again") from None
            raise NotAStoreError(f"{root}: not a windowkit store (no {MANIFEST_NAME}; check "
                                 "the bucket and the prefix)") from None
        if size > MAX_MANIFEST_BYTES:
            raise StoreError(f"{path}: {size} bytes, larger than any manifest")
        return bytes(remote_call(path, "cat_file", key))


def read_store_id(root: Path) -> str | None:
    """The store id in ``root``'s manifest, without validating the rest (None if
    there is no readable manifest). Object storage that does not answer is
    :class:`StoreUnreachableError`: it says nothing of the store."""
    try:
        value = json.loads(read_manifest_bytes(root)).get("store_id")
    except StoreUnreachableError:
        raise
    except (OSError, ValueError, AttributeError, RecursionError, StoreError):
        return None
    return value if isinstance(value, str) else None


REMOTE_CHECK_SECONDS = 1.0  # object storage: how often a reader asks for the manifest


class StoreGuard:
    """Notices that the store at ``root`` was replaced while it is being read.

    Readers call :meth:`check` after opening (or reading) a data file. A
    replaced store is a new directory: when the root's identity changed, the
    manifest's store id must still be the one the reader started with. On
    object storage the identity is the manifest object's ETag, and asking for
    it is a request: it is asked at most every ``REMOTE_CHECK_SECONDS`` (a
    replacing store's objects go under other keys, the old ones are deleted
    only after the new manifest is written).
    Pickles as path and id; a new process checks the id on first use.
    """

    def __init__(self, root: Path, store_id: str) -> None:
        self.root = root
        self.store_id = store_id
        self._identity: tuple[Any, ...] | None = None
        self._asked_at = -math.inf  # when the remote identity was last asked

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_identity": None, "_asked_at": -math.inf}

    def check(self, *, fresh: bool = False) -> None:
        """Raise :class:`StoreReplacedError` if the store was replaced; ``fresh``
        asks object storage now (before a read failure is called corruption)."""
        if is_remote(self.root):
            now = time.monotonic()
            if (not fresh and self._identity is not None
                    and now - self._asked_at < REMOTE_CHECK_SECONDS):
                return
            identity, self._asked_at = self._remote_identity(), now
        else:
            identity = self._local_identity()
        if identity is not None and identity == self._identity:
            return
        current = read_store_id(self.root)
        if current != self.store_id:
            now_is = f"store id {current[:12]}" if current else "no store"
            raise StoreReplacedError(
                f"{self.root}: the store was replaced while it was being read (opened as "
                f"store id {self.store_id[:12]}, now {now_is}); open it again")
        self._identity = identity

    def _local_identity(self) -> tuple[Any, ...] | None:
        """The root directory's device and inode: a replaced store is a new directory."""
        try:
            info = os.stat(self.root)
        except OSError:
            return None
        return (info.st_dev, info.st_ino)

    def _remote_identity(self) -> tuple[Any, ...] | None:
        """The manifest object's ETag and size: a new store writes a new manifest.
        A server that cannot be reached, or does not answer in time, is
        :class:`StoreUnreachableError` (never "replaced")."""
        manifest = as_url_path(self.root / MANIFEST_NAME)
        try:
            with remote_errors(self.root):
                info = remote_call(manifest, "info", manifest.path)
        except StoreUnreachableError:
            raise
        except (OSError, ValueError):  # no manifest there: read_store_id tells
            return None
        return (info.get("ETag") or info.get("mtime") or info.get("LastModified"),
                info.get("size"))
