"""Where a conversion's store goes, from the first check to the published
store: the one place that knows the target.

:meth:`StoreTarget.of` turns ``out`` into a :class:`LocalTarget` (a
directory) or a :class:`RemoteTarget` (a URL fsspec understands: the store is
built in a local mirror and uploaded, :mod:`._remote`). The pipeline then asks
the target alone: :meth:`~StoreTarget.building` checks the target and holds
the locked workspace the store is written into, :meth:`~StoreTarget.publish`
puts the finished store in place, :meth:`~StoreTarget.open` opens it.

What a conversion may write, replace and delete at a local target: nothing
that windowkit did not write, and nothing that would not open as a store. A
target that is a symbolic link to a directory (a store kept on another disk)
is written where the link leads, under the same rules; the link itself stays.
The target never holds a source and is never the current directory (or one
holding it): a store is published by renaming a directory into place, and
only with a manifest that passes the open-time validation. ``--overwrite``
replaces only an empty directory or a windowkit store whose manifest passes
that validation and whose every file it lists at its recorded size (anything
else: refused, nothing touched). A store file may be a link to its content (a
DVC or git-annex checkout). The old store is moved aside, and each of its
files is deleted only while its size and SHA-256 still match its manifest: a
link is removed, never what it leads to (a DVC or git-annex cache keeps its
content); a file changed (or added) since is kept, and named in a warning.

The workspace (:class:`Workspace`) is ``.{name}.windowkit-partial`` beside
the target: made by windowkit (a marker file says so; a directory of that
name without it is refused, never emptied), never a symbolic link (refused,
and opened with ``O_NOFOLLOW``), and locked (``flock``) while a conversion
runs, so a second one for the same target fails fast; the kernel drops the
lock when the process dies, however it dies. ``_resume/plan.json`` records
what is being built (a digest of the sources' fingerprint, the options and
the part plan), and each finished part leaves a marker with its summary,
statistics, the size and SHA-256 of each of its files and a digest of the
source rows it was made from, written only after those files are on disk
(fsync). Re-running the same conversion reuses every part whose files still
match and whose source rows are unchanged (the pipeline checks those); a
changed source or changed options start over. An error while resuming (a
read error, the target appearing) keeps the finished parts. Publishing
validates the new manifest exactly as opening the store will, checks the
target again, removes the resume records, fsyncs every file and renames the
workspace into place, replacing an old store only as the rules above allow.
(The file operations it uses: :mod:`._files`.)
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import stat
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from windowkit._walk import walk_files
from windowkit.conversion._files import (
    files_match,
    fsync,
    fsync_tree,
    lock_directory,
    write_json_durably,
)
from windowkit.conversion._remote import (
    check_remote_target,
    local_mirror,
    remote_lock,
    upload_store,
    workspace_prefix,
)
from windowkit.errors import (
    DiskSpaceError,
    Interrupted,
    OutOfMemoryError,
    SourceChangedError,
    StoreError,
    StoreExistsError,
    WindowkitError,
)
from windowkit.location import AnyPath, is_remote, list_objects, resolve
from windowkit.manifest import (
    MANIFEST_NAME,
    FileEntry,
    Manifest,
    file_digest,
    read_manifest_bytes,
)

if TYPE_CHECKING:
    from windowkit.store import Store

log = logging.getLogger("windowkit")

RESUME_DIR = "_resume"
STAGING_DIR = "_staging"  # table sources, staged anew by every run
MARKER = ".windowkit-workspace"  # written first: windowkit made this directory
PLAN_FILE = "plan.json"
#: a finished part's marker in ``_resume/``; the on-disk name keeps the old word
PART_MARKER = "shard-{:05d}.json"
_INTERNAL = {RESUME_DIR, STAGING_DIR, MARKER}

#: a finished part's marker, as :meth:`Workspace.finished_parts` returns it
PartMarkers = dict[int, dict[str, Any]]


# -- the target ---------------------------------------------------------------------------
class StoreTarget(ABC):
    """Where a conversion's store goes (``out``), and what it may replace there.

    ``directory`` is the local directory the store is built beside and
    published into (set by :meth:`building`); ``built`` the finished store of
    the same target when it may be this conversion's (then nothing is
    written); ``upload_to`` where part files are uploaded as they are written
    (a URL prefix), or None."""

    directory: Path
    built: Manifest | None = None
    upload_to: AnyPath | None = None

    def __init__(self, location: AnyPath, *, overwrite: bool) -> None:
        self.location = location
        self.overwrite = overwrite

    @staticmethod
    def of(out: str | os.PathLike[str], storage_options: dict[str, Any] | None, *,
           overwrite: bool) -> StoreTarget:
        """The target ``out`` names: a directory, or a URL (``storage_options``
        going to its filesystem)."""
        location = resolve(out, storage_options)
        kind = RemoteTarget if is_remote(location) else LocalTarget
        return kind(location, overwrite=overwrite)

    @abstractmethod
    def building(self, sources: Sequence[str]) -> AbstractContextManager[Workspace]:
        """Check the target (it must hold none of ``sources``), then hold the
        locked workspace the store is written into for the body; after a
        failure leave only what a re-run resumes (:meth:`Workspace.after_failure`)."""

    @abstractmethod
    def publish(self, workspace: Workspace) -> None:
        """Put the store finished in ``workspace`` (its manifest written) in place."""

    def parts_in_place(self, markers: PartMarkers | None) -> PartMarkers | None:
        """Those of the finished parts ``markers`` whose files are where the
        store is built (all of them, unless they are uploaded)."""
        return markers

    def check_same_conversion(self, store_id: str) -> None:
        """:attr:`built` is this conversion's (``store_id``, a digest of the
        sources and of every option its bytes depend on): nothing to do; else
        it is refused as any other store without ``overwrite``."""
        assert self.built is not None, "only a target that holds a finished store"
        if store_id != self.built.store_id:
            raise StoreExistsError(f"{self.directory}: target exists and is not empty; "
                                   "pass --overwrite to replace it")
        log.info("%s: already holds this conversion (the same sources and options); "
                 "nothing to do", self.directory)

    def open(self) -> Store:
        """The published store, opened."""
        from windowkit.store import open_store

        return open_store(self.location)


class LocalTarget(StoreTarget):
    """A directory, or a symbolic link to one (written where it leads): built
    in a workspace beside it, published by a rename."""

    @contextlib.contextmanager
    def building(self, sources: Sequence[str]) -> Iterator[Workspace]:
        self.directory = through_link(self.location)
        self.built = None if self.overwrite else finished_manifest(self.directory)
        with _workspace_for(self.directory, overwrite=self.overwrite or self.built is not None,
                            sources=sources) as workspace:
            yield workspace

    def publish(self, workspace: Workspace) -> None:
        workspace.publish(overwrite=self.overwrite)


class RemoteTarget(StoreTarget):
    """A URL: locked by an object beside it, built in a local mirror whose
    parts are uploaded as they are written, published by uploading the rest,
    the manifest last (:mod:`._remote`)."""

    _mirrored = False  # the store is published in the mirror, ready to upload

    @contextlib.contextmanager
    def building(self, sources: Sequence[str]) -> Iterator[Workspace]:
        with remote_lock(self.location):
            replaced = check_remote_target(self.location, overwrite=self.overwrite)
            self.directory = local_mirror(self.location)
            self.directory.parent.mkdir(parents=True, exist_ok=True)
            self.upload_to = workspace_prefix(self.location)
            with _workspace_for(self.directory, overwrite=True, sources=sources) as workspace:
                yield workspace
            if self._mirrored:
                upload_store(self.directory, self.location, replaced=replaced)

    def publish(self, workspace: Workspace) -> None:
        workspace.publish(overwrite=True)
        self._mirrored = True

    def parts_in_place(self, markers: PartMarkers | None) -> PartMarkers | None:
        """Those whose files were uploaded whole."""
        if not markers or self.upload_to is None:
            return markers
        uploaded = list_objects(self.upload_to)
        return {n: m for n, m in markers.items()
                if all(uploaded.get(f["path"]) == f["bytes"] for f in m["files"])}


@contextlib.contextmanager
def _workspace_for(directory: Path, *, overwrite: bool,
                   sources: Sequence[str]) -> Iterator[Workspace]:
    """Check ``directory`` (:func:`check_target`), then lock the workspace
    beside it for the body; unlock it after, and after a failure leave only
    what :meth:`Workspace.after_failure` keeps."""
    check_target(directory, overwrite=overwrite, sources=sources)
    workspace = Workspace(directory)
    workspace.lock()  # before staging: a second conversion must not touch our files
    try:
        yield workspace
    except BaseException as exc:
        workspace.after_failure(exc)
        raise
    finally:
        workspace.release()


# -- the workspace ------------------------------------------------------------------------
class Workspace:
    """The partial store of one conversion target."""

    def __init__(self, out: Path) -> None:
        self.out = out
        where = Path(os.path.abspath(out))  # "." or "a/..": beside the directory it names
        self.root = where.parent / f".{where.name}.windowkit-partial"
        self.inherited = False  # it held finished parts of an earlier run
        self._fd: int | None = None
        self._created_parents: list[Path] = []

    @property
    def _resume(self) -> Path:
        return self.root / RESUME_DIR

    @property
    def staging(self) -> Path:
        """A directory for staged table rows, emptied by every run."""
        return self.root / STAGING_DIR

    def lock(self) -> None:
        """Create (or find) the workspace and lock it, or fail at once."""
        if os.path.islink(self.root):
            raise StoreError(f"{self.root}: the workspace is a symbolic link; a workspace "
                             "is never written through a link (remove it and run again)")
        missing = [p for p in self.root.parents if not os.path.lexists(p)]
        self.root.parent.mkdir(parents=True, exist_ok=True)
        self._created_parents = missing  # removed again by discard() when left empty
        with contextlib.suppress(FileExistsError):
            os.mkdir(self.root)
        try:
            fd = lock_directory(self.root)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise StoreError(f"{self.root}: the workspace is a symbolic link or not a "
                                 "directory; a workspace is never written through a link"
                                 ) from exc
            raise
        if fd is None:
            raise StoreError(f"{self.out}: another windowkit convert is writing this store "
                             f"(its workspace {self.root} is locked)")
        self._fd = fd
        entries = set(os.listdir(self.root))
        # without the marker: empty, or a finished store whose rename was interrupted
        if entries and MARKER not in entries and not is_finished_store(self.root):
            self.release()
            raise StoreExistsError(f"{self.root}: exists and was not made by windowkit (it "
                                   f"holds {sorted(entries)[0]!r}); move it away and run again")
        if MARKER not in entries:
            marker = os.open(self.root / MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL
                             | os.O_NOFOLLOW, 0o644)
            os.close(marker)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def prepare_staging(self) -> Path:
        shutil.rmtree(self.staging, ignore_errors=True)
        self.staging.mkdir()
        return self.staging

    def finished_parts(self, plan_key: str) -> PartMarkers | None:
        """The markers of the finished parts whose files are intact (by number)
        when the workspace holds an interrupted conversion of the same plan, else
        ``None``. Nothing is deleted."""
        try:
            recorded = json.loads((self._resume / PLAN_FILE).read_text())["plan"]
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError):
            recorded = None
        if recorded != plan_key:
            if self.resumable:
                log.info("%s: the sources or options changed since the interrupted "
                         "conversion; starting over", self.out)
            return None
        done = _intact_parts(self._resume, self.root)
        self.inherited = bool(done)
        return done

    def keep_only(self, markers: PartMarkers) -> None:
        """Resume: delete every file an interrupted run left half-written, keeping
        the format's prepared files and the finished parts' files."""
        prepared = json.loads((self._resume / PLAN_FILE).read_text())["prepared"]
        keep = {str(name) for name in prepared} | {
            f["path"] for m in markers.values() for f in m["files"]}
        for relative in self.files():
            if relative not in keep:
                os.unlink(self.root / relative)

    def start_over(self) -> None:
        """Empty the workspace (keeping the staged rows) for a fresh conversion."""
        self.inherited = False
        for child in os.scandir(self.root):
            if child.name in (STAGING_DIR, MARKER):
                continue
            if child.is_dir(follow_symlinks=False):
                shutil.rmtree(child.path)
            else:
                os.unlink(child.path)

    def files(self) -> list[str]:
        """The store's files so far (relative, sorted), without windowkit's own records."""
        return sorted(relative for relative, _ in walk_files(self.root)
                      if relative.split("/")[0] not in _INTERNAL)

    def start(self, plan_key: str) -> None:
        """Record the plan and the files written so far (the format's empty
        store): from now on the workspace can be resumed."""
        self._resume.mkdir(exist_ok=True)
        write_json_durably(self._resume / PLAN_FILE,
                           {"plan": plan_key, "prepared": self.files()})

    def part_finished(self, number: int, marker: dict[str, Any]) -> None:
        write_json_durably(self._resume / PART_MARKER.format(number),
                           {**marker, "number": number})

    def publish(self, *, overwrite: bool) -> None:
        """Check the new manifest (as opening the store will) and the target
        again, make every file durable, rename the workspace to the target and
        delete the store it replaces (its own unchanged files only)."""
        check_publishable(self.root, self.out)
        check_target(self.out, overwrite=overwrite)  # it may have appeared meanwhile
        replacing = prepare_target(self.out)  # an empty directory is removed
        for name in (RESUME_DIR, STAGING_DIR):
            shutil.rmtree(self.root / name, ignore_errors=True)
        os.unlink(self.root / MARKER)
        fsync_tree(self.root)
        # a valid windowkit store is moved aside, its files deleted once ours is in place
        retired = retire_store(self.out) if replacing else None
        os.replace(self.root, self.out)
        fsync(self.root.parent)
        if retired is not None:
            remove_store(retired, self.out)

    def discard(self) -> None:
        """Remove the workspace, and the directories made for it (after a user
        mistake: nothing is left behind)."""
        if os.path.islink(self.root) or not os.path.isdir(self.root):
            return
        shutil.rmtree(self.root, ignore_errors=True)
        for parent in self._created_parents:  # innermost first
            try:
                parent.rmdir()
            except OSError:
                break

    def leave(self) -> None:
        """Remove what a run that had nothing to do made: the workspace, or only its
        staged rows when it holds an interrupted conversion to resume."""
        if self.resumable:
            shutil.rmtree(self.staging, ignore_errors=True)
        else:
            self.discard()

    def after_failure(self, exc: BaseException) -> None:
        """Leave nothing behind after a user mistake; keep finished parts after
        anything else (an interruption, a read error, too little space, a target
        that appeared meanwhile), so that the same command resumes."""
        mistake = isinstance(exc, WindowkitError) and not isinstance(
            exc, (DiskSpaceError, StoreExistsError, SourceChangedError, OutOfMemoryError))
        if self.inherited or (self.resumable and not mistake):
            shutil.rmtree(self.staging, ignore_errors=True)
            if not isinstance(exc, Interrupted):  # whoever sent the signal is told so
                log.info("%s: conversion stopped; run the same command again to resume it",
                         self.out)
        else:
            self.discard()

    @property
    def resumable(self) -> bool:
        """Whether the workspace holds a started conversion that a re-run resumes."""
        return (self._resume / PLAN_FILE).exists()


def _intact_parts(resume: Path, root: Path) -> PartMarkers:
    """The markers in ``resume`` (by part number) whose files under ``root`` are
    intact; a damaged marker is skipped (that part is written again)."""
    done: PartMarkers = {}
    for path in sorted(resume.glob(PART_MARKER.replace("{:05d}", "*"))):
        try:
            marker = json.loads(path.read_text())
            files = [FileEntry(**f) for f in marker["files"]]
            number = int(marker["number"])
        except (ValueError, KeyError, TypeError):
            continue  # a damaged marker: that part is written again
        if files_match(root, files):
            done[number] = marker
    return done


# -- what may be written, replaced and deleted at a local target ------------------------
def store_manifest(directory: Path) -> Manifest | None:
    """The manifest of the windowkit store at ``directory``, validated as
    :func:`windowkit.open_store` validates it; None when there is no manifest.
    An invalid one is a :class:`StoreExistsError`: such a directory is not
    replaced (its listing cannot be trusted to name only windowkit's files)."""
    if not os.path.lexists(directory / MANIFEST_NAME):
        return None
    try:
        return Manifest.read(directory)
    except StoreError as exc:
        raise StoreExistsError(
            f"{directory}: --overwrite replaces only a windowkit store or an empty directory, "
            f"and its {MANIFEST_NAME} does not open as one ({_reason(exc, directory)}); "
            "nothing was changed") from None


def _reason(exc: StoreError, directory: Path) -> str:
    """``exc``'s message without the path it starts with."""
    text = str(exc)
    for prefix in (f"{directory / MANIFEST_NAME}: ", f"{directory}: "):
        text = text.removeprefix(prefix)
    return text


def _foreign_content(directory: Path) -> str | None:
    """What in ``directory`` windowkit did not write, or changed since (None: it
    is a valid store whose every file its manifest lists, at its size)."""
    manifest = store_manifest(directory)
    if manifest is None:
        entries = sorted(os.listdir(directory))
        more = f" and {len(entries) - 1} more entries" if len(entries) > 1 else ""
        return f"it holds {entries[0]!r}{more} and no windowkit manifest"
    sizes = {key: entry.bytes for key, entry in zip(manifest.file_keys(), manifest.files,
                                                     strict=True)}
    for relative, is_link in walk_files(directory):
        if relative == MANIFEST_NAME:
            continue
        if relative not in sizes or (is_link and not os.path.isfile(directory / relative)):
            return f"it holds {relative!r}, which windowkit did not write"
        if os.stat(directory / relative).st_size != sizes[relative]:  # through a link too
            return f"{relative!r} was changed since windowkit wrote it"
    return None


def is_finished_store(directory: Path) -> bool:
    """Whether ``directory`` holds a valid store and nothing else (a workspace
    whose rename into place was interrupted)."""
    try:
        return _foreign_content(directory) is None
    except StoreExistsError:
        return False


def finished_manifest(out: Path) -> Manifest | None:
    """The manifest of the valid store at ``out`` when it holds nothing else (a
    finished conversion, which the same conversion need not write again), else None."""
    if os.path.islink(out) or not os.path.isdir(out) or not any(os.scandir(out)):
        return None
    return store_manifest(out) if is_finished_store(out) else None


def through_link(out: Path) -> Path:
    """Where a store named ``out`` is written: ``out``, or the directory it
    links to (a store kept on another disk: the rules below then apply to that
    directory, and the link stays). A link to anything else is one line."""
    if not os.path.islink(out):
        return out
    real = Path(os.path.realpath(out))
    if not real.is_dir():
        raise StoreExistsError(f"{out}: is a symbolic link to {real}, which is not a "
                               "directory; a store is written through a link only to a "
                               "directory (a windowkit store, or an empty one)")
    return real


def check_target(out: Path, *, overwrite: bool, sources: Sequence[str] = ()) -> None:
    """Refuse a target that is a link, holds a source, is the current directory
    (or holds it), or is not empty and may not be replaced: only a valid
    windowkit store or an empty directory may be, with ``overwrite``. Nothing
    is changed."""
    if os.path.islink(out):  # a link swapped in after through_link()
        raise StoreExistsError(f"{out}: is a symbolic link; name the directory it leads "
                               "to, or run again")
    real_out = os.path.realpath(out)
    for source in sources:
        real = os.path.realpath(source)
        if real == real_out or real.startswith(real_out.rstrip(os.sep) + os.sep):
            raise StoreExistsError(f"{out}: holds the source {source}; write the store "
                                   "somewhere else (--out)")
    _refuse_working_directory(out, real_out)
    if not os.path.lexists(out):
        return
    if not out.is_dir():
        raise StoreExistsError(f"{out}: exists and is not a directory")
    if not any(os.scandir(out)):
        return
    if not overwrite:
        raise StoreExistsError(f"{out}: target exists and is not empty; "
                               "pass --overwrite to replace it")
    problem = _foreign_content(out)
    if problem is not None:
        raise StoreExistsError(f"{out}: --overwrite replaces only a windowkit store or an "
                               f"empty directory, and {problem}; nothing was changed")


def _refuse_working_directory(out: Path, real_out: str) -> None:
    """A store is published by renaming a directory into place beside it: the
    current directory (or one holding it, or ``/``) cannot be the target."""
    cwd = os.path.realpath(os.getcwd())
    if real_out == os.path.dirname(real_out) or cwd == real_out or cwd.startswith(
            real_out.rstrip(os.sep) + os.sep):
        raise StoreExistsError(f"{out}: is the current directory or holds it; a store is "
                               "published by renaming a new directory into place, so name "
                               "one inside it (e.g. --out ./store)")


def check_publishable(workspace: Path, out: Path) -> None:
    """Refuse to publish a manifest (in ``workspace``, bound for ``out``) that
    opening the store would refuse."""
    try:
        raw = read_manifest_bytes(workspace)
    except StoreError as exc:
        raise StoreError(f"{out}: the store was not published: {exc}") from None
    try:
        Manifest.parse(raw, str(out / MANIFEST_NAME))
    except StoreError as exc:
        raise StoreError(f"{exc}; nothing was published") from None


def prepare_target(out: Path) -> bool:
    """Just before publishing (``out`` checked again by :func:`check_target`):
    remove ``out`` if it is an empty directory, refusing if something appeared
    in it meanwhile. Whether ``out`` holds a store to replace."""
    replacing = os.path.lexists(out) and store_manifest(out) is not None
    if os.path.lexists(out) and not replacing:  # an empty directory
        try:
            os.rmdir(out)
        except OSError as exc:  # something appeared in it: keep our work, touch nothing
            raise StoreExistsError(f"{out}: target is no longer empty; nothing "
                                   "was changed (run again to finish)") from exc
    return replacing


def retire_store(out: Path) -> Path:
    """Move the store at ``out`` aside, into a new directory beside it (its files
    are deleted by :func:`remove_store` once the new store is in place)."""
    where = Path(os.path.abspath(out))
    retired = Path(tempfile.mkdtemp(prefix=f".{where.name}.windowkit-old-", dir=where.parent))
    os.replace(out, retired)
    return retired


def remove_store(directory: Path, out: Path) -> None:
    """Delete a retired store's files: each its (valid) manifest lists whose size
    and SHA-256 still match, then the manifest and the empty directories. Keep,
    and name in a warning, anything else (a file changed or added since)."""
    try:
        manifest = Manifest.read(directory)
    except StoreError:
        manifest = None
    entries = zip(manifest.file_keys(), manifest.files, strict=True) if manifest else []
    for key, entry in entries:
        path = directory / key
        with contextlib.suppress(FileNotFoundError):
            info = os.stat(path)  # a link: what it leads to, which is never deleted
            if (stat.S_ISREG(info.st_mode) and info.st_size == entry.bytes
                    and file_digest(path) == entry.sha256):
                os.unlink(path)  # a link: the link alone
    if manifest is not None:
        os.unlink(directory / MANIFEST_NAME)
    for folder, _, _ in sorted(os.walk(directory), key=lambda item: -len(item[0])):
        with contextlib.suppress(OSError):
            os.rmdir(folder)
    kept = sorted(relative for relative, _ in walk_files(directory)) if os.path.lexists(
        directory) else []
    if kept:
        more = f" (and {len(kept) - 1} more files)" if len(kept) > 1 else ""
        log.warning("%s: kept %r%s of the replaced store in %s: changed since windowkit "
                    "wrote it, or not written by windowkit", out, kept[0], more, directory)
