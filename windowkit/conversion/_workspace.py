"""Where a store is built before it is published: atomic, locked, resumable, and
careful with everything windowkit did not write.

A conversion writes into ``.{name}.windowkit-partial`` beside the target. The
workspace is made by windowkit (a marker file says so; a directory of that name
without it is refused, never emptied), is never a symbolic link (refused, and
opened with ``O_NOFOLLOW``), and is locked (``flock``) while a conversion runs,
so a second one for the same target fails fast; the kernel drops the lock when
the process dies, however it dies.

``_resume/plan.json`` records what is being built (a digest of the sources'
fingerprint, the options and the shard plan), and each finished shard leaves a
marker with its summary, statistics, the size and SHA-256 of each of its files
and a digest of the source rows it was made from, written only after those
files are on disk (fsync). Re-running the same conversion reuses every shard
whose files still match and whose source rows are unchanged (the caller checks
those); a changed source or changed options start over. An error while
resuming (a read error, the target appearing) keeps the finished shards.

The workspace is always beside the target (``--out .``, the current directory,
is refused: it cannot be renamed into place). Publishing validates the new
manifest exactly as opening the store will (nothing unopenable is published),
checks the target again, removes the resume records, fsyncs every file and
renames the workspace into place. ``--overwrite`` replaces only an empty
directory or a windowkit store whose manifest passes the open-time validation
and whose every file it lists at its recorded size (anything else: refused,
nothing touched). The old store is moved aside, and each of its files is
deleted only while its size and SHA-256 still match its manifest; a file
changed (or added) since is kept, and named in a warning.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from windowkit.errors import StoreError, StoreExistsError
from windowkit.manifest import MANIFEST_NAME, FileEntry, Manifest, file_digest, read_manifest_bytes

log = logging.getLogger("windowkit")

RESUME_DIR = "_resume"
STAGING_DIR = "_staging"  # table sources, staged anew by every run
MARKER = ".windowkit-workspace"  # written first: windowkit made this directory
PLAN_FILE = "plan.json"
_INTERNAL = {RESUME_DIR, STAGING_DIR, MARKER}


def _write_json_durably(path: Path, payload: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as fh:
        json.dump(payload, fh, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync(path.parent)


def fsync(path: Path) -> None:
    """Flush a file's or a directory's (its entries') writes to disk."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | (os.O_DIRECTORY if path.is_dir() else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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


def walk_files(root: Path) -> Iterable[tuple[str, bool]]:
    """``(relative path, is a link)`` of every file and link under ``root``,
    never descending into a linked directory."""
    for directory, dirs, names in os.walk(root):
        for name in [*names, *(d for d in dirs if os.path.islink(os.path.join(directory, d)))]:
            full = os.path.join(directory, name)
            yield os.path.relpath(full, root).replace(os.sep, "/"), os.path.islink(full)


# -- the target ------------------------------------------------------------------------
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
        if is_link or relative not in sizes:
            return f"it holds {relative!r}, which windowkit did not write"
        if os.lstat(directory / relative).st_size != sizes[relative]:
            return f"{relative!r} was changed since windowkit wrote it"
    return None


def _is_finished_store(directory: Path) -> bool:
    """Whether ``directory`` holds a valid store and nothing else (a workspace
    whose rename into place was interrupted)."""
    try:
        return _foreign_content(directory) is None
    except StoreExistsError:
        return False


def check_target(out: Path, *, overwrite: bool, sources: Sequence[str] = ()) -> None:
    """Refuse a target that is a link, holds a source, is the current directory
    (or holds it), or is not empty and may not be replaced: only a valid
    windowkit store or an empty directory may be, with ``overwrite``. Nothing
    is changed."""
    if os.path.islink(out):
        raise StoreExistsError(f"{out}: is a symbolic link; windowkit writes a store only "
                               "to a real directory (it follows no links)")
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
                               "pass overwrite=True (--overwrite) to replace it")
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


def _remove_store(directory: Path, out: Path) -> None:
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
            info = os.lstat(path)
            if (stat.S_ISREG(info.st_mode) and info.st_size == entry.bytes
                    and file_digest(path) == entry.sha256):
                os.unlink(path)
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


# -- the workspace -----------------------------------------------------------------------
class Workspace:
    """The partial store of one conversion target."""

    def __init__(self, out: Path) -> None:
        self.out = out
        where = Path(os.path.abspath(out))  # "." or "a/..": beside the directory it names
        self.root = where.parent / f".{where.name}.windowkit-partial"
        self.inherited = False  # it held finished shards of an earlier run
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
            raise StoreError(f"{self.root}: the workspace is a symbolic link; windowkit "
                             "follows no links (remove it and run again)")
        missing = [p for p in self.root.parents if not os.path.lexists(p)]
        self.root.parent.mkdir(parents=True, exist_ok=True)
        self._created_parents = missing  # removed again by discard() when left empty
        with contextlib.suppress(FileExistsError):
            os.mkdir(self.root)
        try:
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise StoreError(f"{self.root}: the workspace is a symbolic link or not a "
                                 "directory; windowkit follows no links") from exc
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreError(f"{self.out}: another windowkit convert is writing this store "
                             f"(its workspace {self.root} is locked)") from None
        self._fd = fd
        entries = set(os.listdir(self.root))
        # without the marker: empty, or a finished store whose rename was interrupted
        if entries and MARKER not in entries and not _is_finished_store(self.root):
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

    def finished_shards(self, plan_key: str) -> dict[int, dict[str, Any]] | None:
        """The markers of the finished shards whose files are intact (by number)
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
        done: dict[int, dict[str, Any]] = {}
        for path in sorted(self._resume.glob("shard-*.json")):
            try:
                marker = json.loads(path.read_text())
                files = [FileEntry(**f) for f in marker["files"]]
                number = int(marker["number"])
            except (ValueError, KeyError, TypeError):
                continue  # a damaged marker: that shard is written again
            if files_match(self.root, files):
                done[number] = marker
        self.inherited = bool(done)
        return done

    def keep_only(self, markers: dict[int, dict[str, Any]]) -> None:
        """Resume: delete every file an interrupted run left half-written, keeping
        the format's prepared files and the finished shards' files."""
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
        _write_json_durably(self._resume / PLAN_FILE,
                            {"plan": plan_key, "prepared": self.files()})

    def shard_finished(self, number: int, marker: dict[str, Any]) -> None:
        _write_json_durably(self._resume / f"shard-{number:05d}.json",
                            {**marker, "number": number})

    def publish(self, *, overwrite: bool) -> None:
        """Check the new manifest (as opening the store will) and the target
        again, make every file durable, rename the workspace to the target and
        delete the store it replaces (its own unchanged files only)."""
        self.check_manifest()
        check_target(self.out, overwrite=overwrite)  # it may have appeared meanwhile
        replacing = os.path.lexists(self.out) and store_manifest(self.out) is not None
        if os.path.lexists(self.out) and not replacing:  # an empty directory
            try:
                os.rmdir(self.out)
            except OSError as exc:  # something appeared in it: keep our work, touch nothing
                raise StoreExistsError(f"{self.out}: target is no longer empty; nothing "
                                       "was changed (run again to finish)") from exc
        for name in (RESUME_DIR, STAGING_DIR):
            shutil.rmtree(self.root / name, ignore_errors=True)
        os.unlink(self.root / MARKER)
        for directory, _, names in os.walk(self.root):
            for name in names:
                fsync(Path(directory) / name)
            fsync(Path(directory))
        retired = None
        if replacing:  # a valid windowkit store: moved aside, its files deleted below
            name = Path(os.path.abspath(self.out)).name
            retired = Path(tempfile.mkdtemp(prefix=f".{name}.windowkit-old-",
                                            dir=self.root.parent))
            os.replace(self.out, retired)
        os.replace(self.root, self.out)
        fsync(self.root.parent)
        if retired is not None:
            _remove_store(retired, self.out)

    def check_manifest(self) -> None:
        """Refuse to publish a manifest that opening the store would refuse."""
        try:
            raw = read_manifest_bytes(self.root)
        except StoreError as exc:
            raise StoreError(f"{self.out}: the store was not published: {exc}") from None
        try:
            Manifest.parse(raw, str(self.out / MANIFEST_NAME))
        except StoreError as exc:
            raise StoreError(f"{exc}; nothing was published") from None

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

    @property
    def resumable(self) -> bool:
        """Whether the workspace holds a started conversion that a re-run resumes."""
        return (self._resume / PLAN_FILE).exists()
