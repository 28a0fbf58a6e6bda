"""Converting to object storage, which has no atomic rename: the manifest,
written last, is the commit.

The store is first written, resumably, into a local mirror (a directory under
the user's cache named after the target URL), with every rule of a local
conversion. Then its files are uploaded under the target, concurrently, and
the manifest last: until then nothing under the target opens as a store. An
``.windowkit-incomplete`` object under the target marks an upload in
progress, so an interrupted one is recognised (and replaced) by the next run
of the same command. A lock object beside the target, created with a
conditional write, makes a second conversion to the same target fail at once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from windowkit.errors import StoreExistsError
from windowkit.location import AnyPath, as_url_path, remote_errors
from windowkit.manifest import MANIFEST_NAME

log = logging.getLogger("windowkit")

INCOMPLETE = ".windowkit-incomplete"  # under the target while files are uploaded
LOCK_SUFFIX = ".windowkit-lock"  # beside the target while a conversion runs


def local_mirror(target: AnyPath) -> Path:
    """Where the store for ``target`` is written before it is uploaded (and where
    an interrupted conversion resumes): ``$WINDOWKIT_CACHE`` or
    ``~/.cache/windowkit``, ``remote/<hash of the URL>/store``."""
    base = Path(os.environ.get("WINDOWKIT_CACHE") or Path.home() / ".cache" / "windowkit")
    key = hashlib.sha256(str(target).encode()).hexdigest()[:20]
    return base / "remote" / key / "store"


def _listing(target: AnyPath) -> set[str]:
    """Every object under the target prefix, relative to it."""
    url = as_url_path(target)
    prefix = url.path.rstrip("/") + "/"
    with remote_errors(target):
        try:
            return {name[len(prefix):] for name in url.fs.find(prefix)}
        except FileNotFoundError:
            return set()


def check_remote_target(target: AnyPath, *, overwrite: bool) -> set[str]:
    """The objects a conversion to ``target`` may replace (a windowkit store's, or
    an interrupted upload's); refuse anything else, as for a local target."""
    present = _listing(target)
    if not present or INCOMPLETE in present:
        return present
    if MANIFEST_NAME not in present:
        example = sorted(present)[0]
        raise StoreExistsError(f"{target}: holds {example!r} and no windowkit manifest; a "
                               "conversion writes only to an empty prefix or over a "
                               "windowkit store (--overwrite); nothing was changed")
    if not overwrite:
        raise StoreExistsError(f"{target}: a store exists; pass --overwrite to replace it")
    listed = json.loads((target / MANIFEST_NAME).read_bytes()).get("files", [])
    known = {entry.get("path") for entry in listed if isinstance(entry, dict)}
    foreign = sorted(present - known - {MANIFEST_NAME})
    if foreign:
        raise StoreExistsError(f"{target}: --overwrite replaces only a windowkit store, and "
                               f"{foreign[0]!r} is not one of its files; nothing was changed")
    return present


@contextmanager
def remote_lock(target: AnyPath) -> Iterator[None]:
    """Hold the lock object beside ``target`` (a conditional write: the second
    conversion to one target fails at once)."""
    url = as_url_path(target)
    lock = url.path.rstrip("/") + LOCK_SUFFIX
    with remote_errors(target):
        try:
            with url.fs.open(lock, "xb") as fh:
                fh.write(json.dumps({"pid": os.getpid()}).encode())
        except FileExistsError:
            raise StoreExistsError(
                f"{target}: another conversion to this target is running (lock object "
                f"{url.protocol}://{lock}); if none is, delete that object") from None
    try:
        yield
    finally:
        with remote_errors(target):
            url.fs.rm_file(lock)


def commit(fs: Any, manifest: Path, remote: str) -> None:
    """Upload the manifest: from now on the target opens as the new store."""
    fs.put_file(str(manifest), remote)


def upload_store(local: Path, target: AnyPath, *, replaced: set[str]) -> None:
    """Upload the store at ``local`` under ``target``, the manifest last, then
    delete the ``replaced`` objects the new store does not have."""
    url = as_url_path(target)
    prefix = url.path.rstrip("/")
    manifest = json.loads((local / MANIFEST_NAME).read_bytes())
    files = [entry["path"] for entry in manifest["files"]]
    with remote_errors(target):
        url.fs.pipe_file(f"{prefix}/{INCOMPLETE}", manifest["store_id"].encode())
        if MANIFEST_NAME in replaced:  # the old store stops opening before it changes
            url.fs.rm_file(f"{prefix}/{MANIFEST_NAME}")
        url.fs.put([str(local / name) for name in files],
                   [f"{prefix}/{name}" for name in files])
        commit(url.fs, local / MANIFEST_NAME, f"{prefix}/{MANIFEST_NAME}")
        stale = sorted(replaced - set(files) - {MANIFEST_NAME, INCOMPLETE})
        if stale:
            url.fs.rm([f"{prefix}/{name}" for name in stale])
        url.fs.rm_file(f"{prefix}/{INCOMPLETE}")
    log.info("%s: uploaded %d files", target, len(files) + 1)
    shutil.rmtree(local.parent, ignore_errors=True)
