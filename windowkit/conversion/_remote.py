"""Converting to object storage, which has no atomic rename: the manifest,
written last, is the commit.

Parts are written where they run (in this process, a worker process or a
Dask worker) and uploaded at once into a *workspace prefix* beside the target,
``TARGET.windowkit-partial/``; everything else (staged tables, the resume
records, index and series tables) is written, resumably, into a local mirror
under the user's cache, with every rule of a local conversion (its manifest is
validated with the open-time rules before anything is uploaded). A bucket root
is refused: the workspace and the lock live beside the store.

``--overwrite`` replaces only what windowkit wrote: the old manifest must pass
:meth:`Manifest.parse` (as opening does), every object under the target must
be one it lists, and each must still have the size and SHA-256 it lists (the
old store is read once to check this); anything else is refused, one line,
nothing touched. An ``.windowkit-incomplete`` object under the target marks a
publish in progress and records every version (path, size, SHA-256) of the
objects it writes or replaces, so an interrupted publish is recognised and
replaced by the next run of the same command, and a forged marker names
nothing it could delete.

Replacing a store writes the new one first and swaps by the manifest: its
files go under a new *generation* folder of the target, ``g-<16 hex digits of
its store id>`` (the next 16 if the old store already uses that name), which
its manifest names as ``root``; the new manifest, written last over the old
one, is the swap. Until then the old store opens and reads its own objects,
untouched; after it, its readers get :class:`~windowkit.StoreReplacedError`
and the old objects (those the old manifest or marker lists, at the size and
SHA-256 checked above) are deleted. A first conversion to an empty prefix (or
the re-run of an interrupted first one) writes today's layout, the files at
the target's root, as a local store always does.

A lock object beside the target makes a second conversion to the same target
fail at once. On S3 it is created with a conditional write (If-None-Match);
one left by a killed conversion on this machine is taken over by one write
conditional on the ETag it was judged stale by (If-Match), so of two re-runs
one wins; a process deletes the lock only while its ETag is the one it wrote
(checked, then a conditional delete).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import socket
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from windowkit.errors import StoreError, StoreExistsError
from windowkit.location import AnyPath, as_url_path, list_objects, remote_errors, resolve
from windowkit.manifest import MANIFEST_NAME, FileEntry, Manifest

log = logging.getLogger("windowkit")

INCOMPLETE = ".windowkit-incomplete"  # under the target while files are uploaded
LOCK_SUFFIX = ".windowkit-lock"  # beside the target while a conversion runs
WORKSPACE_SUFFIX = ".windowkit-partial"  # beside the target: the parts written so far


def workspace_prefix(target: AnyPath) -> AnyPath:
    """Where parts are uploaded before the store is published."""
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


@dataclass
class Replaced:
    """What a conversion to a remote target replaces: the objects under it, each
    with the entry (size, SHA-256) it was checked against, and whether a
    manifest object is there."""

    entries: list[FileEntry] = field(default_factory=list)  # paths: keys under the target
    manifest: bool = False
    root: str = ""  # the old manifest's root (its generation folder)


def generation(store_id: str, replaced: Replaced) -> str:
    """The folder the new store's files go under: "" (the target's root) when
    no store is there, else a generation named by the store id, never the
    replaced store's own."""
    if not replaced.manifest:
        return ""
    first = f"g-{store_id[:16]}"
    return first if first != replaced.root else f"g-{store_id[16:]}"


def check_remote_location(target: AnyPath) -> None:
    """Refuse a bucket root: the workspace and the lock live beside the store,
    so a store needs a prefix inside its bucket."""
    url = as_url_path(target)
    split = getattr(url.fs, "split_path", None)
    key = split(url.path)[1] if split is not None else url.path.strip("/")
    if not key.strip("/"):
        example = "/".join(part for part in (url.path.strip("/"), "store") if part)
        raise StoreExistsError(f"{target}: is a bucket root; write the store under a prefix "
                               f"in it (e.g. {url.protocol}://{example}), beside which "
                               "windowkit keeps its workspace and lock")


def _refused(target: AnyPath, problem: str) -> StoreExistsError:
    return StoreExistsError(f"{target}: --overwrite replaces only a windowkit store, and "
                            f"{problem}; nothing was changed")


def _recorded(target: AnyPath, present: dict[str, int]
              ) -> tuple[dict[str, list[FileEntry]], str]:
    """The versions (size, SHA-256) of each object windowkit wrote under
    ``target``, by key: those its valid manifest lists and, during an
    interrupted publish, those its incomplete marker lists (the old store's and
    the new); and the manifest's root."""
    recorded: dict[str, list[FileEntry]] = {}
    root = ""
    if INCOMPLETE in present:
        try:
            marker = json.loads((target / INCOMPLETE).read_bytes())
            entries = [FileEntry.model_validate(entry) for entry in marker["files"]]
        except (ValueError, KeyError, TypeError) as exc:  # ValidationError is a ValueError
            raise _refused(target, f"{INCOMPLETE!r} is not a marker windowkit wrote") from exc
        for entry in entries:
            recorded.setdefault(entry.path, []).append(entry)
    if MANIFEST_NAME in present:
        try:
            manifest = Manifest.parse((target / MANIFEST_NAME).read_bytes(),
                                      f"{target}/{MANIFEST_NAME}")
        except StoreError as exc:
            reason = str(exc).removeprefix(f"{target}/{MANIFEST_NAME}: ")
            raise _refused(target, f"its {MANIFEST_NAME} does not open as one ({reason})"
                           ) from None
        root = manifest.root
        for key, entry in zip(manifest.file_keys(), manifest.files, strict=True):
            recorded.setdefault(key, []).append(entry.model_copy(update={"path": key}))
    return recorded, root


def _digest(target: AnyPath, name: str) -> str:
    """The SHA-256 of the object ``target/name`` (read once, streamed)."""
    url = as_url_path(target / name)
    with url.fs.open(url.path, "rb", block_size=8 << 20, cache_type="none") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def check_remote_target(target: AnyPath, *, overwrite: bool) -> Replaced:
    """The objects a conversion to ``target`` may replace: a valid windowkit
    store's (or an interrupted publish's), each at the size and SHA-256 windowkit
    recorded for it. Anything else is refused, as for a local target."""
    present = list_objects(target)
    if not present:
        return Replaced()
    with remote_errors(target):
        recorded, root = _recorded(target, present)
    if not recorded and MANIFEST_NAME not in present:
        raise StoreExistsError(f"{target}: holds {sorted(present)[0]!r} and no windowkit "
                               "manifest; a conversion writes only to an empty prefix or "
                               "over a windowkit store (--overwrite); nothing was changed")
    if INCOMPLETE not in present and not overwrite:
        raise StoreExistsError(f"{target}: a store exists; pass --overwrite to replace it")
    names = sorted(set(present) - {MANIFEST_NAME, INCOMPLETE})
    foreign = [name for name in names if name not in recorded]
    if foreign:
        raise _refused(target, f"{foreign[0]!r} is not one of its files")
    with remote_errors(target), ThreadPoolExecutor(8) as pool:
        digests = dict(zip(names, pool.map(lambda name: _digest(target, name), names),
                           strict=True))
    entries = []
    for name in names:
        match = [e for e in recorded[name]
                 if e.bytes == present[name] and e.sha256 == digests[name]]
        if not match:
            raise _refused(target, f"{name!r} was changed since windowkit wrote it")
        entries.append(match[0])
    return Replaced(entries, MANIFEST_NAME in present, root)


# -- the lock -----------------------------------------------------------------------------
def _stale(raw: bytes) -> bool:
    """Whether the lock object's content names a conversion on this machine
    whose process is gone (killed): then the same command may take it over."""
    try:
        holder = json.loads(raw)
    except ValueError:
        return False
    return (isinstance(holder, dict) and holder.get("host") == socket.gethostname()
            and isinstance(holder.get("pid"), int) and not psutil.pid_exists(holder["pid"]))


def _precondition_failed(exc: BaseException) -> bool:
    """Whether object storage refused a conditional request (HTTP 412)."""
    cause = getattr(exc, "__cause__", None)
    code = (getattr(cause, "response", None) or {}).get("Error", {}).get("Code")
    return code in ("PreconditionFailed", "412")


def _busy(target: AnyPath, lock: str, how: str = "") -> StoreExistsError:
    url = as_url_path(target)
    return StoreExistsError(f"{target}: another conversion to this target is running{how} "
                            f"(lock object {url.protocol}://{lock}); if none is, delete that "
                            "object")


def _take_s3_lock(fs: Any, target: AnyPath, lock: str, holder: bytes) -> str:
    """Create the lock object (If-None-Match), or take over a stale one with one
    write conditional on the ETag it was judged stale by (If-Match): of two
    processes taking it over together, one wins. Returns the lock's ETag."""
    bucket, key, _ = fs.split_path(lock)
    try:
        return str(fs.call_s3("put_object", Bucket=bucket, Key=key, Body=holder,
                              IfNoneMatch="*")["ETag"])
    except FileExistsError:
        pass
    try:
        etag = fs.call_s3("head_object", Bucket=bucket, Key=key)["ETag"]
        seen = fs.cat_file(lock)  # if it changed since the HEAD, the write below fails
    except FileNotFoundError:  # released meanwhile: try again later
        raise _busy(target, lock, " (its lock was just released: run again)") from None
    if not _stale(seen):
        raise _busy(target, lock)
    log.info("%s: taking over the lock of a conversion that was killed", target)
    try:
        return str(fs.call_s3("put_object", Bucket=bucket, Key=key, Body=holder,
                              IfMatch=etag)["ETag"])
    except (FileNotFoundError, OSError) as exc:
        if isinstance(exc, FileNotFoundError) or _precondition_failed(exc):
            raise _busy(target, lock, " (it took over the stale lock first)") from None
        raise
    finally:
        fs.invalidate_cache(lock)


def _release_s3_lock(fs: Any, target: AnyPath, lock: str, etag: str) -> None:
    """Delete the lock object only while it is the one this process wrote (its
    ETag, checked by a HEAD and again by the conditional delete)."""
    bucket, key, _ = fs.split_path(lock)
    try:
        now = fs.call_s3("head_object", Bucket=bucket, Key=key)["ETag"]
    except FileNotFoundError:
        now = None
    if now != etag:
        log.warning("%s: the lock object %s is no longer this conversion's; left in place",
                    target, lock)
        return
    try:
        fs.call_s3("delete_object", Bucket=bucket, Key=key, IfMatch=etag)
    except OSError as exc:
        if _precondition_failed(exc):
            log.warning("%s: the lock object %s was taken over meanwhile; left in place",
                        target, lock)
            return
        if isinstance(exc, FileNotFoundError):
            return
        fs.rm_file(lock)  # a server without conditional deletes: ours, by its ETag
    finally:
        fs.invalidate_cache(lock)


@contextmanager
def remote_lock(target: AnyPath) -> Iterator[None]:
    """Hold the lock object beside ``target`` (a conditional write: the second
    conversion to one target fails at once; one left by a killed conversion on
    this machine is taken over by one conditional write). A process deletes
    only the lock it holds."""
    check_remote_location(target)
    url = as_url_path(target)
    lock = url.path.rstrip("/") + LOCK_SUFFIX
    token = uuid.uuid4().hex
    holder = json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                         "token": token}).encode()
    s3 = hasattr(url.fs, "call_s3")
    with remote_errors(target):
        etag = _take_s3_lock(url.fs, target, lock, holder) if s3 else _take_lock(
            url.fs, target, lock, holder)
    try:
        yield
    finally:
        with remote_errors(target):
            if s3:
                _release_s3_lock(url.fs, target, lock, etag)
            else:
                _release_lock(url.fs, lock, token)


def _take_lock(fs: Any, target: AnyPath, lock: str, holder: bytes) -> str:
    """The lock on a filesystem without conditional writes on ETags (the
    takeover of a stale lock is then not atomic)."""
    try:
        with fs.open(lock, "xb") as fh:
            fh.write(holder)
    except FileExistsError:
        if not _stale(fs.cat_file(lock)):
            raise _busy(target, lock) from None
        log.info("%s: taking over the lock of a conversion that was killed", target)
        fs.pipe_file(lock, holder)
    return ""


def _release_lock(fs: Any, lock: str, token: str) -> None:
    try:
        holder = json.loads(fs.cat_file(lock))
    except (FileNotFoundError, ValueError):
        return
    if isinstance(holder, dict) and holder.get("token") == token:
        fs.rm_file(lock)


# -- publishing ---------------------------------------------------------------------------
def commit(fs: Any, manifest: bytes, remote: str) -> None:
    """Write the manifest: from now on the target opens as the new store (the swap)."""
    fs.pipe_file(remote, manifest)


def _published_manifest(local: Path, replaced: Replaced) -> tuple[Manifest, bytes]:
    """The manifest of the local mirror as published: under its generation
    folder when it replaces a store, validated again with the open-time rules."""
    where = str(local / MANIFEST_NAME)
    manifest = Manifest.parse((local / MANIFEST_NAME).read_bytes(), where)
    manifest = manifest.with_root(generation(manifest.store_id, replaced))
    raw = (json.dumps(manifest.to_dict(), indent=2, sort_keys=True) + "\n").encode()
    return Manifest.parse(raw, where), raw


def upload_store(local: Path, target: AnyPath, *, replaced: Replaced) -> None:
    """Publish: the part objects of the workspace prefix and the files of the
    local mirror ``local`` under ``target`` (under a new generation folder when
    a store is there), the manifest last; then delete the ``replaced`` objects
    the new store does not have, and the workspace."""
    url = as_url_path(target)
    prefix = url.path.rstrip("/")
    workspace = as_url_path(workspace_prefix(target)).path.rstrip("/")
    manifest, raw = _published_manifest(local, replaced)
    files = [entry.path for entry in manifest.files]
    keys = dict(zip(files, manifest.file_keys(), strict=True))
    local_files = [name for name in files if (local / name).is_file()]
    uploaded = list_objects(workspace_prefix(target))
    sizes = {entry.path: entry.bytes for entry in manifest.files}
    part_files = [name for name in files if name not in local_files]
    lost = [name for name in part_files if uploaded.get(name) != sizes[name]]
    if lost:
        raise StoreError(f"{target}: the uploaded part file {lost[0]!r} is missing or "
                         f"changed in {url.protocol}://{workspace}; run the conversion again")
    # what this publish writes or replaces, each version: a rerun may replace exactly that
    written = [entry.model_copy(update={"path": keys[entry.path]}) for entry in manifest.files]
    marker = {"store_id": manifest.store_id,
              "files": [e.model_dump() for e in [*written, *replaced.entries]]}
    with remote_errors(target):
        url.fs.pipe_file(f"{prefix}/{INCOMPLETE}", json.dumps(marker).encode())
        url.fs.copy([f"{workspace}/{name}" for name in part_files],
                    [f"{prefix}/{keys[name]}" for name in part_files])
        upload_files(local, local_files, target / manifest.root if manifest.root else target)
        commit(url.fs, raw, f"{prefix}/{MANIFEST_NAME}")
        stale = sorted({entry.path for entry in replaced.entries} - set(keys.values()))
        if stale:
            url.fs.rm([f"{prefix}/{name}" for name in stale])
        url.fs.rm_file(f"{prefix}/{INCOMPLETE}")
        if uploaded:
            url.fs.rm(workspace, recursive=True)
    log.info("%s: published %d files", target, len(files) + 1)
    shutil.rmtree(local.parent, ignore_errors=True)
