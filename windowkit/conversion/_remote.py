"""Converting to object storage, which has no atomic rename: the manifest,
written last, is the commit.

Shards are written where they run (in this process, a worker process or a
Dask worker) and uploaded at once into a *workspace prefix* beside the target,
``TARGET.windowkit-partial/``; everything else (staged tables, the resume
records, index and series tables) is written, resumably, into a local mirror
under the user's cache, with every rule of a local conversion. Publishing
copies the shard objects under the target (server-side), uploads the mirror's
files, and writes the manifest last: until then nothing under the target opens
as a store (an old store there keeps opening until its manifest is replaced).
An ``.windowkit-incomplete`` object under the target marks a publish in
progress, so an interrupted one is recognised and replaced by the next run of
the same command. A lock object beside the target, created with a
conditional write, makes a second conversion to the same target fail at once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

from windowkit.conversion._workspace import manifest_files
from windowkit.errors import StoreError, StoreExistsError
from windowkit.location import AnyPath, as_url_path, list_objects, remote_errors, resolve
from windowkit.manifest import MANIFEST_NAME

log = logging.getLogger("windowkit")

INCOMPLETE = ".windowkit-incomplete"  # under the target while files are uploaded
LOCK_SUFFIX = ".windowkit-lock"  # beside the target while a conversion runs
WORKSPACE_SUFFIX = ".windowkit-partial"  # beside the target: the shards written so far


def workspace_prefix(target: AnyPath) -> AnyPath:
    """Where shards are uploaded before the store is published."""
    url = as_url_path(target)
    return resolve(f"{url.protocol}://{url.path.rstrip('/')}{WORKSPACE_SUFFIX}",
                   dict(url.storage_options) or None)


def upload_files(local_root: Path, relative: list[str], prefix: AnyPath) -> None:
    """Upload ``local_root/<path>`` to ``prefix/<path>`` for each path, concurrently."""
    url = as_url_path(prefix)
    with remote_errors(prefix):
        url.fs.put([str(local_root / name) for name in relative],
                   [f"{url.path.rstrip('/')}/{name}" for name in relative])


def local_mirror(target: AnyPath) -> Path:
    """Where the store for ``target`` is written before it is uploaded (and where
    an interrupted conversion resumes): ``$WINDOWKIT_CACHE`` or
    ``~/.cache/windowkit``, ``remote/<hash of the URL>/store``."""
    base = Path(os.environ.get("WINDOWKIT_CACHE") or Path.home() / ".cache" / "windowkit")
    key = hashlib.sha256(str(target).encode()).hexdigest()[:20]
    return base / "remote" / key / "store"


def _ours(target: AnyPath, present: set[str]) -> set[str] | None:
    """The objects windowkit wrote under ``target``: those its manifest lists, or
    during an interrupted publish those its incomplete marker lists."""
    with remote_errors(target):
        if INCOMPLETE in present:
            try:
                marked = json.loads((target / INCOMPLETE).read_bytes()).get("files")
            except (ValueError, AttributeError):
                return None
            if not isinstance(marked, list) or not all(isinstance(m, str) for m in marked):
                return None
            return {*marked, INCOMPLETE}
        if MANIFEST_NAME in present:
            return manifest_files((target / MANIFEST_NAME).read_bytes())
    return None


def check_remote_target(target: AnyPath, *, overwrite: bool) -> set[str]:
    """The objects a conversion to ``target`` may replace (a windowkit store's, or
    an interrupted publish's); refuse anything else, as for a local target."""
    present = set(list_objects(target))
    if not present:
        return present
    ours = _ours(target, present)
    if ours is None:
        raise StoreExistsError(f"{target}: holds {sorted(present)[0]!r} and no windowkit "
                               "manifest; a conversion writes only to an empty prefix or "
                               "over a windowkit store (--overwrite); nothing was changed")
    if INCOMPLETE not in present and not overwrite:
        raise StoreExistsError(f"{target}: a store exists; pass --overwrite to replace it")
    foreign = sorted(present - ours)
    if foreign:
        raise StoreExistsError(f"{target}: --overwrite replaces only a windowkit store, and "
                               f"{foreign[0]!r} is not one of its files; nothing was changed")
    return present


def _stale(fs: Any, lock: str) -> bool:
    """Whether the lock object was left by a conversion on this machine whose
    process is gone (killed): then the same command may take it over."""
    try:
        holder = json.loads(fs.cat_file(lock))
    except (OSError, ValueError):
        return False
    return (isinstance(holder, dict) and holder.get("host") == socket.gethostname()
            and isinstance(holder.get("pid"), int) and not psutil.pid_exists(holder["pid"]))


@contextmanager
def remote_lock(target: AnyPath) -> Iterator[None]:
    """Hold the lock object beside ``target`` (a conditional write: the second
    conversion to one target fails at once; one left by a killed conversion on
    this machine is taken over)."""
    url = as_url_path(target)
    lock = url.path.rstrip("/") + LOCK_SUFFIX
    holder = json.dumps({"host": socket.gethostname(), "pid": os.getpid()}).encode()
    with remote_errors(target):
        try:
            with url.fs.open(lock, "xb") as fh:
                fh.write(holder)
        except FileExistsError:
            if not _stale(url.fs, lock):
                raise StoreExistsError(
                    f"{target}: another conversion to this target is running (lock object "
                    f"{url.protocol}://{lock}); if none is, delete that object") from None
            log.info("%s: taking over the lock of a conversion that was killed", target)
            url.fs.pipe_file(lock, holder)
    try:
        yield
    finally:
        with remote_errors(target):
            url.fs.rm_file(lock)


def commit(fs: Any, manifest: Path, remote: str) -> None:
    """Upload the manifest: from now on the target opens as the new store."""
    fs.put_file(str(manifest), remote)


def upload_store(local: Path, target: AnyPath, *, replaced: set[str]) -> None:
    """Publish: the shard objects of the workspace prefix and the files of the
    local mirror ``local`` under ``target``, the manifest last; then delete the
    ``replaced`` objects the new store does not have, and the workspace."""
    url = as_url_path(target)
    prefix = url.path.rstrip("/")
    workspace = as_url_path(workspace_prefix(target)).path.rstrip("/")
    manifest = json.loads((local / MANIFEST_NAME).read_bytes())
    files = [entry["path"] for entry in manifest["files"]]
    local_files = [name for name in files if (local / name).is_file()]
    uploaded = list_objects(workspace_prefix(target))
    sizes = {entry["path"]: entry["bytes"] for entry in manifest["files"]}
    shard_files = [name for name in files if name not in local_files]
    lost = [name for name in shard_files if uploaded.get(name) != sizes[name]]
    if lost:
        raise StoreError(f"{target}: the uploaded shard file {lost[0]!r} is missing or "
                         f"changed in {url.protocol}://{workspace}; run the conversion again")
    # what this publish writes or replaces: a rerun may replace exactly that
    marker = {"store_id": manifest["store_id"],
              "files": sorted({*files, *replaced, MANIFEST_NAME} - {INCOMPLETE})}
    with remote_errors(target):
        url.fs.pipe_file(f"{prefix}/{INCOMPLETE}", json.dumps(marker).encode())
        if MANIFEST_NAME in replaced:  # the old store stops opening before it changes
            url.fs.rm_file(f"{prefix}/{MANIFEST_NAME}")
        url.fs.copy([f"{workspace}/{name}" for name in shard_files],
                    [f"{prefix}/{name}" for name in shard_files])
        upload_files(local, local_files, target)
        commit(url.fs, local / MANIFEST_NAME, f"{prefix}/{MANIFEST_NAME}")
        stale = sorted(replaced - set(files) - {MANIFEST_NAME, INCOMPLETE})
        if stale:
            url.fs.rm([f"{prefix}/{name}" for name in stale])
        url.fs.rm_file(f"{prefix}/{INCOMPLETE}")
        if uploaded:
            url.fs.rm(workspace, recursive=True)
    log.info("%s: published %d files", target, len(files) + 1)
    shutil.rmtree(local.parent, ignore_errors=True)
