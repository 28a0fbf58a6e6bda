"""What a conversion may write, replace and delete at its target: nothing that
windowkit did not write, and nothing that would not open as a store.

A target that is a symbolic link to a directory (a store kept on another
disk) is written where the link leads, under the same rules; the link itself
stays. The target never holds a source and is never the current directory
(or one holding it): a store is published by renaming a directory into
place, and only with a manifest that passes the open-time validation.
``--overwrite`` replaces only an empty directory or a windowkit store whose
manifest passes that validation and whose every file it lists at its recorded
size (anything else: refused, nothing touched). A store file may be a link to
its content (a DVC or git-annex checkout). The old store is moved aside, and
each of its files is deleted only while its size and SHA-256 still match its
manifest: a link is removed, never what it leads to (a DVC or git-annex
cache keeps its content); a file changed (or added) since is kept, and named
in a warning.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path

from windowkit._walk import walk_files
from windowkit.errors import StoreError, StoreExistsError
from windowkit.manifest import MANIFEST_NAME, Manifest, file_digest, read_manifest_bytes

log = logging.getLogger("windowkit")


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
