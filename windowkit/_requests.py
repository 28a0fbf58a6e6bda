"""Requests to object storage, each given up once its server is silent for a stated time.

botocore and s3fs retry a request that timed out, each in its own loop (s3fs
around botocore, and around itself when it reads a body), so a server that
stops answering would hold a reader for many times the read timeout. Every
request windowkit makes therefore runs under one limit of its own,
:attr:`Timeouts.limit` (a read timeout and a connect timeout, retries
included), counted from when the request has a connection to go out on (see
:func:`_gate`), not while it waits for one. A server that gives no answer in
that time is one :class:`~windowkit.errors.StoreUnreachableError` line naming
the URL and the timeouts.

The limit is on silence, not on a whole transfer: a read from S3 is read as
its bytes come (:func:`_watched_read`), each byte starting the limit again, so
a slow link that keeps sending reads however long the answer (a merged read
of many blocks), as botocore's read timeout counts time between bytes. A read
on another filesystem, whose bytes cannot be watched, gets a limit that grows
with its size (:data:`SLOWEST_RATE`).

The timeouts are those of the URL's storage options (``config_kwargs``, as
botocore takes them: ``connect_timeout``, ``read_timeout``), else of the
environment (``WINDOWKIT_CONNECT_TIMEOUT``, ``WINDOWKIT_READ_TIMEOUT``), else
:data:`CONNECT_TIMEOUT` and :data:`READ_TIMEOUT`.
"""

from __future__ import annotations

import asyncio
import math
import os
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from windowkit.errors import InvalidSpecError, StoreUnreachableError

CONNECT_TIMEOUT = 10.0  # seconds to connect to object storage, by default
READ_TIMEOUT = 60.0  # seconds a request waits for the server's answer, by default
#: Where the timeouts are set, besides ``storage_options={"config_kwargs": {...}}``.
TIMEOUT_VARIABLES = {"connect_timeout": "WINDOWKIT_CONNECT_TIMEOUT",
                     "read_timeout": "WINDOWKIT_READ_TIMEOUT"}
#: What botocore and aiohttp raise when a timeout ran out.
TIMEOUTS = ("ReadTimeoutError", "ConnectTimeoutError", "ServerTimeoutError")
POOL_CONNECTIONS = 10  # botocore's max_pool_connections, unless config_kwargs says
BODY_READ = 1 << 20  # bytes of an answer read at a time (a read ends with the bytes come)
#: Bytes a second that the limit of a read whose bytes cannot be watched coming
#: allows for (a filesystem other than s3fs): its limit grows with its size.
SLOWEST_RATE = 16 << 10


def _seconds(given: object, where: str) -> float:
    """A timeout setting as seconds (a positive, finite number), else one line."""
    try:
        value = float(given)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        value = math.nan
    if not 0 < value < math.inf:
        raise InvalidSpecError(f"{where} must be a number of seconds > 0, got {given!r}")
    return value


@dataclass(frozen=True)
class Timeouts:
    """How long object storage is waited for: ``connect`` seconds to connect,
    ``read`` seconds for an answer (per attempt, as botocore's
    ``connect_timeout`` and ``read_timeout``). A request windowkit makes is given
    up once it has gone :attr:`limit` seconds without a byte of its answer,
    whatever retries botocore and s3fs make."""

    connect: float = CONNECT_TIMEOUT
    read: float = READ_TIMEOUT

    @classmethod
    def of(cls, storage_options: Mapping[str, Any]) -> Timeouts:
        """The timeouts ``storage_options`` set (its ``config_kwargs``), else the
        environment's (:data:`TIMEOUT_VARIABLES`), else the defaults."""
        config = storage_options.get("config_kwargs")
        config = config if isinstance(config, Mapping) else {}
        values = {}
        for name, variable in TIMEOUT_VARIABLES.items():
            if config.get(name) is not None:
                given, where = config[name], f"storage_options config_kwargs {name!r}"
            elif os.environ.get(variable):
                given, where = os.environ[variable], variable
            else:
                continue
            values[name.removesuffix("_timeout")] = _seconds(given, where)
        return cls(**values)

    @property
    def limit(self) -> float:
        """Seconds without a byte of its answer after which a request is given
        up, retries included: a read timeout and a connect timeout (of at most 30 s)."""
        return self.read + min(self.connect, 30.0)

    def no_answer(self) -> str:
        """What a message says of a server that gave no answer in time."""
        return (f"the storage endpoint gave no answer within {self.limit:g} s (connect "
                f"timeout {self.connect:g} s, read timeout {self.read:g} s; set them with "
                "storage_options={'config_kwargs': {'connect_timeout': ..., 'read_timeout': "
                "...}} or WINDOWKIT_CONNECT_TIMEOUT, WINDOWKIT_READ_TIMEOUT)")


def remote_timeouts(path: Any) -> Timeouts:
    """The :class:`Timeouts` of the URL path ``path`` (a ``UPath``: its storage options')."""
    return Timeouts.of(path.storage_options)


def remote_call(path: Any, method: str, *args: Any, **kwargs: Any) -> Any:
    """``fs.<method>(*args, **kwargs)`` on the filesystem of the URL path
    ``path`` (a ``UPath``), given up after its :attr:`Timeouts.limit` (an async
    filesystem's, such as s3fs's; another's is called as it is). Other errors
    are raised as they are (``location.remote_errors`` words them)."""
    fs = path.fs
    if not _is_async(fs, method):
        return getattr(fs, method)(*args, **kwargs)
    limits = remote_timeouts(path)
    return _run(path, limits, _within, fs, limits.limit, method, *args, **kwargs)


def fetch_ranges(path: Any, keys: Sequence[str], starts: Sequence[int],
                 stops: Sequence[int]) -> list[bytes]:
    """Byte ranges ``[starts[i], stops[i])`` of the objects ``keys[i]`` on the
    filesystem of the URL path ``path``, fetched concurrently, each request
    given up after the limit; the first error cancels the others."""
    fs = path.fs
    if not _is_async(fs, "cat_file"):
        return list(fs.cat_ranges(list(keys), list(starts), list(stops), on_error="raise"))
    limits = remote_timeouts(path)
    return list(_run(path, limits, _ranges, fs, limits.limit, keys, starts, stops))


def _is_async(fs: Any, method: str) -> bool:
    """Whether ``fs`` is a blocking face of an async filesystem with ``_<method>``."""
    from fsspec.asyn import AsyncFileSystem

    return (isinstance(fs, AsyncFileSystem) and not fs.asynchronous
            and hasattr(fs, f"_{method}"))


def _run(path: Any, limits: Timeouts, coroutine: Any, fs: Any, *args: Any,
         **kwargs: Any) -> Any:
    """``coroutine(fs, *args, **kwargs)`` run on the filesystem's loop; a
    timeout (ours, or one botocore gave up on) is one line naming ``path``."""
    from fsspec.asyn import sync

    try:
        return sync(fs.loop, coroutine, fs, *args, **kwargs)
    except Exception as exc:
        if isinstance(exc, TimeoutError) or type(exc).__name__ in TIMEOUTS:
            raise StoreUnreachableError(f"{path}: {limits.no_answer()}") from exc
        raise


#: Per filesystem: its loop and the semaphore of windowkit's requests on it.
_GATES: weakref.WeakKeyDictionary[Any, tuple[Any, asyncio.Semaphore]] = (
    weakref.WeakKeyDictionary())


def _gate(fs: Any) -> asyncio.Semaphore:
    """(On the filesystem's loop.) What lets as many of windowkit's requests go
    at once as the filesystem has connections, so that a request's limit runs
    while it is out, not while it waits for a connection."""
    loop = asyncio.get_running_loop()
    held = _GATES.get(fs)
    if held is None or held[0] is not loop:  # first use, or a new loop (a forked child)
        config = getattr(fs, "config_kwargs", None) or {}
        size = int(config.get("max_pool_connections") or POOL_CONNECTIONS)
        held = (loop, asyncio.Semaphore(max(1, size)))
        _GATES[fs] = held
    return held[1]


async def _within(fs: Any, limit: float, method: str, *args: Any, **kwargs: Any) -> Any:
    """``fs._<method>(...)``, given up (cancelled) once it has been out ``limit``
    seconds without a byte of its answer: an s3fs read is watched as its bytes
    come (:func:`_watched_read`); another filesystem's read is given ``limit``
    and the time its bytes take at :data:`SLOWEST_RATE`; any other call ``limit``."""
    async with _gate(fs):
        if method == "cat_file":
            if _watchable(fs, *args, **kwargs):
                return await _watched_read(fs, limit, *args, **kwargs)
            start, end = kwargs.get("start"), kwargs.get("end")
            if isinstance(start, int) and isinstance(end, int) and 0 <= start <= end:
                limit += (end - start) / SLOWEST_RATE
        return await asyncio.wait_for(getattr(fs, f"_{method}")(*args, **kwargs), limit)


def _watchable(fs: Any, path: Any = None, start: Any = None, end: Any = None,
               **rest: Any) -> bool:
    """Whether a read (``fs.cat_file``'s arguments) is one :func:`_watched_read`
    makes: of s3fs, with no other options, ``start`` and ``end`` none or >= 0."""
    return (hasattr(fs, "_call_s3") and hasattr(fs, "split_path") and isinstance(path, str)
            and not rest and all(v is None or (isinstance(v, int) and v >= 0)
                                 for v in (start, end)))


async def _watched_read(fs: Any, limit: float, path: str, start: int | None = None,
                        end: int | None = None) -> bytes:
    """Bytes ``[start, end)`` of the object ``path`` (to its end when None) on
    s3fs ``fs``, read as they come: given up (``TimeoutError``) once nothing
    has come for ``limit`` seconds, so a slow link that keeps sending reads. A
    request that fails (a connection closed mid-answer, botocore's read
    timeout) is asked again for the bytes still to come, of the same object
    (its ETag), as often in a row as s3fs retries a request."""
    from botocore.exceptions import IncompleteReadError
    from s3fs.core import S3_RETRYABLE_ERRORS, version_id_kw

    bucket, key, version = fs.split_path(path)
    first = start or 0
    if end is not None and end <= first:
        return b""
    loop = asyncio.get_running_loop()
    got, same, failures = bytearray(), dict(version_id_kw(version)), 0
    async with asyncio.timeout(limit) as silence:  # moved on by every byte that comes
        while True:
            ask, at = dict(same), first + len(got)
            if at or end is not None:
                ask["Range"] = f"bytes={at}-{'' if end is None else end - 1}"
            try:
                answer = await fs._call_s3("get_object", Bucket=bucket, Key=key, **ask)
                if answer.get("ETag"):  # a retry reads on in this object, or fails
                    same.setdefault("IfMatch", answer["ETag"])
                body = answer["Body"]
                try:
                    while piece := await body.read(BODY_READ):
                        got += piece
                        silence.reschedule(loop.time() + limit)
                        failures = 0
                finally:
                    body.close()
                return bytes(got)
            except (*S3_RETRYABLE_ERRORS, IncompleteReadError):  # botocore's read timeout too
                failures += 1
                if failures >= max(1, int(getattr(fs, "retries", 5))):
                    raise
                await asyncio.sleep(min(0.1 * 1.7 ** failures, 15.0))


async def _ranges(fs: Any, limit: float, keys: Sequence[str], starts: Sequence[int],
                  stops: Sequence[int]) -> list[bytes]:
    """Every range at once, each within ``limit``; the first error cancels the rest."""
    tasks = [asyncio.ensure_future(_within(fs, limit, "cat_file", key, start=start, end=stop))
             for key, start, stop in zip(keys, starts, stops, strict=True)]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        raise
