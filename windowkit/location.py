"""Where a store or a source lives: a local path, or a URL that fsspec understands.

Local paths (and ``file://`` URLs) stay :class:`pathlib.Path`, with today's
behaviour and speed. Anything else (``s3://``, ``gs://``, ``az://``,
``memory://``, ...) becomes a :class:`upath.UPath`: the same path API over an
fsspec filesystem. Credentials and endpoints come from where each ecosystem
keeps them (for S3: the AWS environment variables and config files,
``AWS_ENDPOINT_URL`` included), or from ``storage_options``.

Errors of the remote kind (no such bucket, no credentials, an endpoint that
does not answer) become one :class:`windowkit.StoreError` line naming the URL.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit

from windowkit.errors import InvalidSpecError, StoreError, WindowkitError

if TYPE_CHECKING:
    import pyarrow.parquet as pq
    from upath import UPath

REMOTE_MAX_GAP = 1 << 20  # ranges closer than this: one request (a request costs more)

AnyPath = Path  # a local Path, or a UPath (which has the same API) for a URL


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
    return UPath(text, **(storage_options or {}))


def as_url_path(path: AnyPath) -> UPath:
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
    :class:`StoreError` for stores, a ``SourceError`` for sources)."""
    try:
        yield
    except (WindowkitError, MemoryError):
        raise
    except Exception as exc:
        message = describe_remote_error(exc)
        if message is None:
            raise
        raise kind(f"{where}: {message}") from exc


def describe_remote_error(exc: BaseException) -> str | None:
    """A short line for an object-store error, or None if it is not one."""
    name = type(exc).__name__
    text = str(exc).splitlines()[0] if str(exc) else name
    if name in ("NoCredentialsError", "PartialCredentialsError"):
        return ("no credentials found (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
                "an AWS profile, or storage_options)")
    if name in ("EndpointConnectionError", "ConnectTimeoutError", "ClientConnectorError",
                "ConnectionRefusedError", "ServerTimeoutError", "ReadTimeoutError"):
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
    same file, which then ask for neither. Remote, a file reads exactly the
    byte ranges pyarrow asks for (no read-ahead; ``pre_buffer`` coalesces a
    row group's column chunks); with ``prefetch=(start, stop)`` (and a known
    file) those bytes are fetched with one request and every read is served
    from them: a read outside them is an error, never a silent request."""
    import pyarrow.parquet as pq

    memo = known if known is not None else {}
    if not is_remote(path):
        handle = pq.ParquetFile(path, metadata=memo.get("footer"), **options)
        memo["footer"] = handle.metadata
        return handle
    url = as_url_path(path)
    details = memo.get("details")
    with remote_errors(path):
        if prefetch is not None and details is not None:
            start, stop = prefetch
            held = url.fs.cat_file(url.path, start=start, end=stop)
            source = url.fs.open(url.path, "rb", size=details["size"], cache_type="parts",
                                 cache_options={"data": {(start, stop): held}, "strict": True})
        else:
            source = url.fs.open(url.path, "rb", cache_type="none",
                                 **({"size": details["size"]} if details else {}))
        if details:
            source.details = details
        handle = pq.ParquetFile(source, metadata=memo.get("footer"), pre_buffer=True, **options)
        memo["details"] = source.details
    memo["footer"] = handle.metadata
    return handle


def list_objects(prefix: AnyPath) -> dict[str, int]:
    """Every object under the URL path ``prefix``, relative to it, with its size
    (none when nothing is there)."""
    url = as_url_path(prefix)
    root = url.path.rstrip("/") + "/"
    with remote_errors(prefix):
        try:
            found = url.fs.find(root, detail=True)
        except FileNotFoundError:
            return {}
    return {name[len(root):]: int(info.get("size") or 0) for name, info in found.items()}


def read_ranges(paths: Sequence[AnyPath], starts: Sequence[int],
                stops: Sequence[int]) -> list[bytes]:
    """Byte ranges ``[starts[i], stops[i])`` of files ``paths[i]`` (one
    filesystem): fetched concurrently from object storage, ranges of one object
    less than ``REMOTE_MAX_GAP`` apart with one request; read in turn from
    local files."""
    if not paths:
        return []
    if not is_remote(paths[0]):
        out, handles = [], {}
        try:
            for path, start, stop in zip(paths, starts, stops, strict=True):
                if path not in handles:
                    handles[path] = open(path, "rb")  # noqa: SIM115 (closed below)
                out.append(os.pread(handles[path].fileno(), stop - start, start))
        finally:
            for handle in handles.values():
                handle.close()
        return out
    from fsspec.utils import merge_offset_ranges

    fs = as_url_path(paths[0]).fs
    keys = [as_url_path(p).path for p in paths]
    merged_keys, merged_starts, merged_stops = merge_offset_ranges(
        keys, list(starts), list(stops), max_gap=REMOTE_MAX_GAP, sort=True)
    with remote_errors(paths[0]):
        blobs = fs.cat_ranges(merged_keys, merged_starts, merged_stops, on_error="raise")
    spans: dict[str, list[tuple[int, bytes]]] = {}
    for key, start, blob in zip(merged_keys, merged_starts, blobs, strict=True):
        spans.setdefault(key, []).append((start, blob))
    out = []
    for key, start, stop in zip(keys, starts, stops, strict=True):
        first, blob = next((a, b) for a, b in reversed(spans[key]) if a <= start)
        out.append(bytes(blob[start - first:stop - first]))
    return out
