"""Where a store or a source lives: a local path, or a URL that fsspec understands.

Local paths (and ``file://`` URLs) stay :class:`pathlib.Path`, with today's
behaviour and speed. Anything else (``s3://``, ``gs://``, ``az://``,
``memory://``, ...) becomes a :class:`upath.UPath`: the same path API over an
fsspec filesystem. Credentials and endpoints come from where each ecosystem
keeps them (for S3: the AWS environment variables and config files,
``AWS_ENDPOINT_URL`` included), or from ``storage_options``.

Errors of the remote kind (no such bucket, no credentials, an endpoint that
does not answer) become one :class:`windowkit.StoreError` line naming the URL.
Every request windowkit makes of object storage is given up after its
:class:`Timeouts` (a connect and a read timeout, retries included): a server
that stops answering is one :class:`~windowkit.errors.StoreUnreachableError`
line naming the URL and the timeouts, never a wait without end.

Local store files are opened without blocking (:func:`open_regular`), and
checked before a library opens them (:func:`refuse_special`): links are
followed (a store behind a symlink, a DVC or git-annex checkout), and what a
path leads to must be a regular file: a FIFO, a device, a socket or a
directory in its place is one line, never a read that waits forever. (Every
block read is checked against its digest, so a link cannot bring in other
rows.)
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit

from windowkit._requests import TIMEOUTS, Timeouts, fetch_ranges, remote_call
from windowkit.errors import InvalidSpecError, StoreError, StoreUnreachableError, WindowkitError

if TYPE_CHECKING:
    import pyarrow.parquet as pq
    from upath import UPath

REMOTE_MAX_GAP = 1 << 20  # ranges closer than this: one request (a request costs more)

AnyPath = Path  # a local Path, or a UPath (which has the same API) for a URL

_S3_SCHEMES = ("s3", "s3a")  # s3fs: ``config_kwargs`` go to botocore's Config


def is_url(location: str | os.PathLike[str]) -> bool:
    """Whether ``location`` names a URL other than a local ``file://`` one."""
    if isinstance(location, Path):
        return is_remote(location)
    text = os.fspath(location)
    scheme = urlsplit(text).scheme if "://" in text else ""
    return bool(scheme) and scheme != "file"


def resolve(location: str | os.PathLike[str],
            storage_options: dict[str, Any] | None = None) -> AnyPath:
    """``location`` as a path: a :class:`Path` when local, else a ``UPath``
    (``storage_options`` go to its filesystem)."""
    if is_remote(location):  # already resolved
        return location  # type: ignore[return-value]
    text = os.fspath(location)
    if not is_url(text):
        if storage_options:
            raise InvalidSpecError(f"{text}: storage_options apply to URLs only (s3://...)")
        return Path(text[len("file://"):] if text.startswith("file://") else text)
    import fsspec
    from upath import UPath

    scheme = urlsplit(text).scheme
    try:
        fsspec.get_filesystem_class(scheme)
    except ImportError:
        extra = " (pip install 'windowkit[s3]')" if scheme in ("s3", "s3a") else ""
        raise InvalidSpecError(f"{text}: the {scheme!r} filesystem is not installed"
                               f"{extra}") from None
    except ValueError:
        known = ", ".join(sorted(p for p in fsspec.available_protocols() if len(p) <= 5)[:12])
        raise InvalidSpecError(f"{text}: unknown URL scheme {scheme!r}; fsspec knows "
                               f"{known}, ...") from None
    options = dict(storage_options or {})
    limits = Timeouts.of(options)  # checked here: a bad setting is one line at once
    if scheme in _S3_SCHEMES:  # botocore's own timeouts, per request: the same ones
        options["config_kwargs"] = {"connect_timeout": limits.connect,
                                    "read_timeout": limits.read,
                                    **(options.get("config_kwargs") or {})}
    return UPath(text, **options)


def as_url_path(path: AnyPath | UPath) -> UPath:
    """``path`` (a URL path, see :func:`is_remote`) typed as the ``UPath`` it is."""
    return cast("UPath", path)


def is_remote(path: object) -> bool:
    """Whether ``path`` is a URL path (a ``UPath`` that is not local)."""
    try:
        from upath import UPath
        from upath.implementations.local import LocalPath
    except ImportError:  # pragma: no cover - fsspec extras not installed
        return False
    return isinstance(path, UPath) and not isinstance(path, LocalPath)


@contextlib.contextmanager
def remote_errors(where: object, kind: type[WindowkitError] = StoreError) -> Iterator[None]:
    """Turn what object storage raises into one ``kind`` line (a
    :class:`StoreError` for stores, a ``SourceError`` for sources; for a store,
    an endpoint that cannot be reached is a :class:`StoreUnreachableError`)."""
    try:
        yield
    except (WindowkitError, MemoryError):
        raise
    except Exception as exc:
        message = describe_remote_error(exc)
        if message is None:
            raise
        unreachable = kind is StoreError and _unreachable(exc)
        raise (StoreUnreachableError if unreachable else kind)(f"{where}: {message}") from exc


_UNREACHABLE = ("EndpointConnectionError", "ConnectionClosedError", "ClientConnectorError",
                "ServerDisconnectedError", *TIMEOUTS)


def _unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says the endpoint could not be reached (or did not answer)."""
    return (type(exc).__name__ in _UNREACHABLE
            or isinstance(exc, ConnectionError | TimeoutError))


def describe_remote_error(exc: BaseException) -> str | None:
    """A short line for an object-store error, or None if it is not one."""
    name = type(exc).__name__
    text = str(exc).splitlines()[0] if str(exc) else name
    if name in ("NoCredentialsError", "PartialCredentialsError"):
        return ("no credentials found (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
                "an AWS profile, or storage_options)")
    if _unreachable(exc):
        return f"cannot reach the storage endpoint ({text})"
    if isinstance(exc, PermissionError):
        return f"access denied ({text})"
    if isinstance(exc, FileNotFoundError):
        return f"not found ({text})"
    if name == "ClientError" or isinstance(exc, OSError):
        return f"the object store refused the request ({text})"
    return None


def open_parquet(path: AnyPath, *, known: dict[str, Any] | None = None,
                 prefetch: tuple[int, int] | None = None, **options: Any) -> pq.ParquetFile:
    """A :class:`pyarrow.parquet.ParquetFile`, local or remote.

    ``known``, when given, is where the first open of a file keeps its footer
    (and, remote, the object's details: size and ETag) for later opens of the
    same file, which then ask for neither. A local file must be a regular file
    (:func:`refuse_special`). Remote, a file reads exactly the byte ranges
    pyarrow asks for (no read-ahead; ``pre_buffer`` coalesces a row group's
    column chunks), each request given up after the URL's :class:`Timeouts`;
    with ``prefetch=(start, stop)`` those bytes are fetched with one request and
    every read is served from them: a read outside them is an error, never a
    silent request."""
    import pyarrow.parquet as pq

    memo = known if known is not None else {}
    if not is_remote(path):
        refuse_special(path)
        handle = pq.ParquetFile(path, metadata=memo.get("footer"), **options)
        memo["footer"] = handle.metadata
        return handle
    key = as_url_path(path).path
    with remote_errors(path):
        details = memo.get("details") or remote_call(path, "info", key)
        held = None
        if prefetch is not None:
            start, stop = prefetch
            held = (start, remote_call(path, "cat_file", key, start=start, end=stop))
        source = RemoteFile(path, int(details["size"]), held)
        handle = pq.ParquetFile(source, metadata=memo.get("footer"), pre_buffer=True, **options)
        memo["details"] = details
    memo["footer"] = handle.metadata
    return handle


class RemoteFile(io.RawIOBase):
    """An object on object storage as a read-only file (for pyarrow): each read
    is one ranged request, given up after the URL's :class:`Timeouts`; with
    ``held`` (``(start, bytes)``) every read is served from those bytes, and a
    read outside them is an error."""

    def __init__(self, path: AnyPath, size: int, held: tuple[int, bytes] | None = None) -> None:
        super().__init__()
        self._path, self._key = path, as_url_path(path).path
        self.size, self._held, self._at = size, held, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._at

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._at, os.SEEK_END: self.size}[whence]
        self._at = max(0, base + offset)
        return self._at

    def read(self, size: int | None = -1) -> bytes:
        start = self._at
        stop = self.size if size is None or size < 0 else min(self.size, start + size)
        if stop <= start:
            return b""
        if self._held is None:
            data = remote_call(self._path, "cat_file", self._key, start=start, end=stop)
        else:
            first, blob = self._held
            if not first <= start <= stop <= first + len(blob):
                raise ValueError(f"{self._path}: a read of bytes {start}..{stop} is outside "
                                 f"the bytes fetched ({first}..{first + len(blob)})")
            data = blob[start - first:stop - first]
        self._at = start + len(data)
        return bytes(data)

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(memoryview(buffer).cast("B")))
        memoryview(buffer).cast("B")[:len(data)] = data
        return len(data)

    def readall(self) -> bytes:
        return self.read(-1)


def open_remote(path: AnyPath, block_bytes: int = 8 << 20) -> io.BufferedReader:
    """The object at the URL path ``path`` as a buffered read-only file: read
    ``block_bytes`` a request, each given up after the URL's :class:`Timeouts`."""
    with remote_errors(path):
        size = int(remote_call(path, "info", as_url_path(path).path)["size"])
    return io.BufferedReader(RemoteFile(path, size), buffer_size=block_bytes)


def list_objects(prefix: AnyPath) -> dict[str, int]:
    """Every object under the URL path ``prefix``, relative to it, with its size
    (none when nothing is there), as listed now (not a listing fsspec kept)."""
    url = as_url_path(prefix)
    root = url.path.rstrip("/") + "/"
    with remote_errors(prefix):
        _forget_listings(url.fs, root.rstrip("/"))  # a cached listing is no answer
        try:
            found = remote_call(prefix, "find", root, detail=True)
        except FileNotFoundError:
            return {}
    return {name[len(root):]: int(info.get("size") or 0) for name, info in found.items()}


def _forget_listings(fs: Any, path: str) -> None:
    """Drop what ``fs`` keeps of listings of ``path``, its parents and every
    folder under it (fsspec's ``invalidate_cache`` keeps the folders under it,
    and a later listing does not replace them: their sizes and ETags would be
    those of objects since rewritten)."""
    fs.invalidate_cache(path)
    cache = getattr(fs, "dircache", None)
    if cache is not None:
        for key in [k for k in list(cache) if str(k).startswith(path + "/")]:
            cache.pop(key, None)


def read_ranges(paths: Sequence[AnyPath], starts: Sequence[int],
                stops: Sequence[int]) -> list[bytes]:
    """Byte ranges ``[starts[i], stops[i])`` of files ``paths[i]`` (one
    filesystem): fetched concurrently from object storage, ranges of one object
    less than ``REMOTE_MAX_GAP`` apart with one request, given up after the
    URL's :class:`Timeouts`; read in turn from local files, each opened with
    :func:`open_regular`."""
    if not paths:
        return []
    if not is_remote(paths[0]):
        out, handles = [], {}
        try:
            for path, start, stop in zip(paths, starts, stops, strict=True):
                if path not in handles:
                    handles[path] = open_regular(path)
                out.append(os.pread(handles[path], stop - start, start))
        finally:
            for handle in handles.values():
                os.close(handle)
        return out
    from fsspec.utils import merge_offset_ranges

    keys = [as_url_path(p).path for p in paths]
    merged_keys, merged_starts, merged_stops = merge_offset_ranges(
        keys, list(starts), list(stops), max_gap=REMOTE_MAX_GAP, sort=True)
    with remote_errors(paths[0]):
        blobs = fetch_ranges(paths[0], merged_keys, merged_starts, merged_stops)
    spans: dict[str, list[tuple[int, bytes]]] = {}
    for key, start, blob in zip(merged_keys, merged_starts, blobs, strict=True):
        spans.setdefault(key, []).append((start, blob))
    out = []
    for key, start, stop in zip(keys, starts, stops, strict=True):
        first, blob = next((a, b) for a, b in reversed(spans[key]) if a <= start)
        out.append(bytes(blob[start - first:stop - first]))
    return out


# -- local files ---------------------------------------------------------------------------
_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFDIR: "a directory", stat.S_IFLNK: "a link",
          stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFSOCK: "a socket"}


def not_regular(path: str | os.PathLike[str], mode: int) -> StoreError | None:
    """The error for a file of ``mode`` at ``path`` that is not a regular file
    (``<path>: is not a regular file (a FIFO)``), else None."""
    if stat.S_ISREG(mode):
        return None
    return StoreError(f"{path}: is not a regular file "
                      f"({_KINDS.get(stat.S_IFMT(mode), 'of an unknown kind')})")


def refuse_special(path: str | os.PathLike[str]) -> None:
    """One :class:`StoreError` line when the local ``path`` is there but leads
    (through any links) to something other than a regular file (a FIFO, a
    device, a socket, a directory): what is checked before a library (pyarrow,
    zarr) opens it, as an open of a FIFO waits for a writer forever. Nothing
    when it is not there: the opener says so."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    error = not_regular(path, mode)
    if error is not None:
        raise error


def open_regular(path: str | os.PathLike[str]) -> int:
    """A descriptor of the local file ``path`` (links followed), opened for
    reading without blocking (a FIFO's open waits for a writer), then checked
    (``fstat`` of what was opened): anything but a regular file is one
    :class:`StoreError` line, never a wait. (The non-blocking flag changes
    nothing for a regular file's reads.)"""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno in (errno.ENXIO, errno.EOPNOTSUPP):  # a socket cannot be opened
            refuse_special(path)
        raise StoreError(f"{path}: cannot open ({exc.strerror or exc})") from exc
    try:
        error = not_regular(path, os.fstat(fd).st_mode)
    except BaseException:
        os.close(fd)
        raise
    if error is not None:
        os.close(fd)
        raise error
    return fd
