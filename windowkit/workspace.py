"""Where a store is built before it is published: atomic, locked, resumable.

A conversion writes into ``.{name}.windowkit-partial`` beside the target. The
directory is locked (``flock``) while a conversion runs, so a second one for
the same target fails fast; the kernel drops the lock when the process dies,
however it dies. ``_resume/plan.json`` records what is being built (a digest
of the sources' fingerprint, the options and the shard plan), and each
finished shard leaves a marker with its summary, statistics and the size and
SHA-256 of each of its files, written only after those files are on disk
(fsync). Re-running the same conversion after an interruption reuses every
shard whose files still match their marker and writes the rest; output is
deterministic, so the result is byte-identical to an uninterrupted run. A
changed source or changed options start over. Publishing fsyncs every file,
removes ``_resume``, and renames the directory into place.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from windowkit.errors import StoreError
from windowkit.manifest import FileEntry

log = logging.getLogger("windowkit")

RESUME_DIR = "_resume"
PLAN_FILE = "plan.json"


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
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def files_match(root: Path, entries: list[FileEntry]) -> bool:
    """Whether every file exists with its recorded size and SHA-256."""
    for entry in entries:
        path = root / entry.path
        try:
            if path.stat().st_size != entry.bytes:
                return False
        except OSError:
            return False
        if FileEntry.of(root, entry.path).sha256 != entry.sha256:
            return False
    return True


class Workspace:
    """The partial store of one conversion target."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.root = out.parent / f".{out.name}.windowkit-partial"
        self._fd: int | None = None
        self._created_parents: list[Path] = []

    @property
    def _resume(self) -> Path:
        return self.root / RESUME_DIR

    def lock(self) -> None:
        """Create (or find) the workspace and lock it, or fail at once."""
        missing = [p for p in self.root.parents if not p.exists()]
        self._created_parents = missing  # removed again by discard() when left empty
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreError(f"{self.out}: another windowkit convert is writing this store "
                             f"(its workspace {self.root} is locked)") from None
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def open(self, plan_key: str) -> dict[int, dict[str, Any]] | None:
        """The markers of the finished shards (by number) when the workspace
        holds an interrupted conversion of the same plan; else ``None``, after
        emptying it."""
        plan = self._resume / PLAN_FILE
        try:
            recorded = json.loads(plan.read_text())
            prepared = [str(name) for name in recorded["prepared"]]
            recorded = recorded["plan"]
        except (OSError, ValueError, KeyError, TypeError):
            recorded, prepared = None, []
        if recorded == plan_key:
            done = self._finished_shards()
            keep = set(prepared) | {f["path"] for m in done.values() for f in m["files"]}
            self._sweep(keep)
            return done
        if recorded is not None:
            log.info("%s: the sources or options changed since the interrupted conversion; "
                     "starting over", self.out)
        self._empty()
        return None

    def _finished_shards(self) -> dict[int, dict[str, Any]]:
        done: dict[int, dict[str, Any]] = {}
        for path in sorted(self._resume.glob("shard-*.json")):
            try:
                marker = json.loads(path.read_text())
                files = [FileEntry(**f) for f in marker["files"]]
                number = int(marker["number"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if files_match(self.root, files):
                done[number] = marker
        return done

    def _sweep(self, keep: set[str]) -> None:
        """Delete every file but ``keep`` (and the resume records): what an
        interrupted run left half-written (temporary files, unfinished shards)."""
        for path in list(self.root.rglob("*")):
            relative = path.relative_to(self.root)
            if relative.parts[0] != RESUME_DIR and str(relative) not in keep and (
                    path.is_file() or path.is_symlink()):
                path.unlink()

    def start(self, plan_key: str) -> None:
        """Record the plan and the files written so far (the format's empty
        store): from now on the workspace can be resumed."""
        prepared = sorted(str(p.relative_to(self.root)) for p in self.root.rglob("*")
                          if p.is_file())
        self._resume.mkdir(exist_ok=True)
        _write_json_durably(self._resume / PLAN_FILE, {"plan": plan_key, "prepared": prepared})

    def shard_finished(self, number: int, marker: dict[str, Any]) -> None:
        _write_json_durably(self._resume / f"shard-{number:05d}.json",
                            {**marker, "number": number})

    def _empty(self) -> None:
        for child in self.root.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()

    def publish(self, overwrite: bool) -> None:
        """Make every file durable, then rename the workspace to the target."""
        shutil.rmtree(self._resume, ignore_errors=True)
        for directory, _, names in os.walk(self.root):
            for name in names:
                fsync(Path(directory) / name)
            fsync(Path(directory))
        old = None
        if self.out.is_dir() and not any(self.out.iterdir()):
            self.out.rmdir()
        if self.out.exists():
            if not overwrite:  # appeared while we converted
                raise StoreError(f"{self.out}: target appeared during the conversion; "
                                 "pass overwrite=True (--overwrite) to replace it")
            old = self.out.parent / f".{self.out.name}.windowkit-old"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(self.out, old)
        os.replace(self.root, self.out)
        fsync(self.out.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def discard(self) -> None:
        """Remove the workspace, and the directories made for it (after a user
        mistake: nothing is left behind)."""
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
