"""The lifecycle of the directory a store is built in before it is published:
atomic, locked, resumable. (What it may replace at the target: :mod:`._target`;
the file operations it uses: :mod:`._files`.)

A conversion writes into ``.{name}.windowkit-partial`` beside the target. The
workspace is made by windowkit (a marker file says so; a directory of that name
without it is refused, never emptied), is never a symbolic link (refused, and
opened with ``O_NOFOLLOW``), and is locked (``flock``) while a conversion runs,
so a second one for the same target fails fast; the kernel drops the lock when
the process dies, however it dies.

``_resume/plan.json`` records what is being built (a digest of the sources'
fingerprint, the options and the part plan), and each finished part leaves a
marker with its summary, statistics, the size and SHA-256 of each of its files
and a digest of the source rows it was made from, written only after those
files are on disk (fsync). Re-running the same conversion reuses every part
whose files still match and whose source rows are unchanged (the caller checks
those); a changed source or changed options start over. An error while
resuming (a read error, the target appearing) keeps the finished parts.

The workspace is always beside the target (``--out .``, the current directory,
is refused: it cannot be renamed into place). Publishing validates the new
manifest exactly as opening the store will (nothing unopenable is published),
checks the target again, removes the resume records, fsyncs every file and
renames the workspace into place, replacing an old store only as
:mod:`._target` allows.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from windowkit._walk import walk_files
from windowkit.conversion._files import (
    files_match,
    fsync,
    fsync_tree,
    lock_directory,
    write_json_durably,
)
from windowkit.conversion._target import (
    check_publishable,
    check_target,
    is_finished_store,
    prepare_target,
    remove_store,
    retire_store,
)
from windowkit.errors import StoreError, StoreExistsError
from windowkit.manifest import FileEntry

log = logging.getLogger("windowkit")

RESUME_DIR = "_resume"
STAGING_DIR = "_staging"  # table sources, staged anew by every run
MARKER = ".windowkit-workspace"  # written first: windowkit made this directory
PLAN_FILE = "plan.json"
#: a finished part's marker in ``_resume/``; the on-disk name keeps the old word
PART_MARKER = "shard-{:05d}.json"
_INTERNAL = {RESUME_DIR, STAGING_DIR, MARKER}


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

    def finished_parts(self, plan_key: str) -> dict[int, dict[str, Any]] | None:
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

    def keep_only(self, markers: dict[int, dict[str, Any]]) -> None:
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

    @property
    def resumable(self) -> bool:
        """Whether the workspace holds a started conversion that a re-run resumes."""
        return (self._resume / PLAN_FILE).exists()


def _intact_parts(resume: Path, root: Path) -> dict[int, dict[str, Any]]:
    """The markers in ``resume`` (by part number) whose files under ``root`` are
    intact; a damaged marker is skipped (that part is written again)."""
    done: dict[int, dict[str, Any]] = {}
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
