"""Object storage behind a slow but healthy link: every format reads, through
every reader of remote stores; a link that stops sending mid-answer is one
:class:`~windowkit.errors.StoreUnreachableError` line naming the URL, in time.

The link is a TCP proxy on 127.0.0.1 in front of the local S3 server (moto)
that sends the server's bytes on at :data:`RATE` bytes a second, one link
shared by every connection; the stores have blocks of about 64 KiB and the
reads a 4 s read timeout (a block takes under a second on the link, a read of
every block far longer than one request's limit)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import fsspec
import numpy as np
import pytest

import windowkit as wk
from tests.conftest import assert_windows_equal, collect_epoch, oracle_windows
from tests.helpers import random_series
from windowkit._requests import Timeouts

pytestmark = pytest.mark.timeout(240)

RATE = 80 << 10  # bytes a second the link sends on
CONNECT, READ = 2.0, 4.0  # the reads' timeouts: a request's limit is 6 s
STALL = Timeouts(0.5, 1.0)  # the timeouts of the reads the link stops on
BLOCK_ROWS = 5400  # 3 float32 features: 64,800 bytes a block
FORMATS = ("tfrecord", "zarr", "parquet")
#: Rows of a store: 9 blocks, 570 KiB, more than the link sends in a request's limit.
ROWS = 9 * BLOCK_ROWS
SPEC = wk.WindowSpec(8, horizon=2, stride=4)


class SlowLink:
    """A TCP proxy on 127.0.0.1 in front of ``upstream`` (``http://host:port``)
    that sends the server's answers on at ``rate`` bytes a second, all
    connections sharing one link; :meth:`stop_after` has it stop sending
    (connections stay open, nothing more arrives) until :meth:`resume`; with
    ``cut`` set, it closes each connection once it has sent ``cut`` bytes on it."""

    PIECE = 4096  # bytes sent at a time

    def __init__(self, upstream: str, rate: float) -> None:
        where = urlsplit(upstream)
        self._upstream = (where.hostname or "127.0.0.1", where.port or 80)
        self.rate = rate
        self.sent = 0  # bytes sent on to clients
        self._budget = float("inf")  # bytes still sent before the link stops
        self.cut: int | None = None  # bytes a connection carries before it is closed
        self.cuts = 0  # connections closed so far
        self._free_at = 0.0  # when the link is free for the next piece (loop time)
        self._tasks: set[asyncio.Task[None]] = set()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self._server = self._on_loop(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    def _on_loop(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(30)

    def stop_after(self, count: int) -> None:
        """Send ``count`` more bytes, then nothing (the connections stay open)."""
        self._budget = count

    def resume(self) -> None:
        self._budget = float("inf")

    async def _serve(self, client_in: asyncio.StreamReader,
                     client_out: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        server_in, server_out = await asyncio.open_connection(*self._upstream)
        pipes = [asyncio.ensure_future(self._pipe(client_in, server_out, paced=False)),
                 asyncio.ensure_future(self._pipe(server_in, client_out, paced=True))]
        try:  # until either side closes (a client that gave up closes its side)
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pipe in pipes:
                pipe.cancel()
            for writer in (client_out, server_out):
                writer.close()
            self._tasks.discard(task)

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, *,
                    paced: bool) -> None:
        """Bytes from ``source`` to ``sink`` until either end closes; ``paced``:
        at the link's rate (the server's answers)."""
        carried = 0
        with contextlib.suppress(ConnectionError):  # a side closed: the connection ends
            while data := await source.read(self.PIECE):
                if paced:
                    if self.cut is not None:
                        data = data[:max(0, self.cut - carried)]
                    await self._pace(len(data))
                    self.sent += len(data)
                    carried += len(data)
                sink.write(data)
                await sink.drain()
                if paced and self.cut is not None and carried >= self.cut:
                    self.cuts += 1
                    return  # the connection is closed mid-answer

    async def _pace(self, count: int) -> None:
        """Wait while the link is stopped, then for ``count`` bytes' turn on it."""
        while self._budget < count:
            await asyncio.sleep(0.02)
        self._budget -= count
        now = self.loop.time()
        self._free_at = max(now, self._free_at) + count / self.rate
        await asyncio.sleep(self._free_at - now)

    def close(self) -> None:
        async def shut() -> None:
            self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.sleep(0.05)

        self._on_loop(shut())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)


@pytest.fixture(scope="module")
def stores(s3_server: str, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[SlowLink, str, dict[str, list[np.ndarray]]]]:
    """A slow link to the local S3 server, the bucket (``s3://NAME``) holding a
    store of each format at ``<bucket>/<format>``, and each store's series."""
    fs = fsspec.filesystem("s3")
    bucket = f"slow-link-{uuid.uuid4().hex[:8]}"
    fs.mkdir(bucket)
    base = tmp_path_factory.mktemp("slow")
    series = {}
    for fmt in FORMATS:
        series[fmt] = random_series([ROWS], seed=len(fmt))
        local = wk.convert(series[fmt], base / fmt, format=fmt, window=SPEC,
                           block_rows=BLOCK_ROWS)
        fs.put(str(local.path), f"{bucket}/{fmt}", recursive=True)
    link = SlowLink(s3_server, RATE)
    try:
        yield link, f"s3://{bucket}", series
    finally:
        link.close()


def _open(link: SlowLink, url: str, timeouts: Timeouts) -> wk.Store:
    """The store at ``url``, reached through ``link``, with ``timeouts``."""
    return wk.open_store(url, storage_options={
        "key": "testing", "secret": "testing", "endpoint_url": link.endpoint,
        "config_kwargs": {"connect_timeout": timeouts.connect,
                          "read_timeout": timeouts.read}})


def _expected(series: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    x, y = oracle_windows(series, SPEC)
    assert y is not None
    return x, y


def _epoch(dataset: Any) -> tuple[np.ndarray, np.ndarray]:
    """Every batch of a torch dataset, in turn: its windows' inputs and targets."""
    batches = [dataset[i] for i in range(len(dataset))]
    return (np.concatenate([x.numpy() for x, _ in batches]),
            np.concatenate([y.numpy() for _, y in batches]))


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_reads_over_a_slow_link(stores: Any, fmt: str) -> None:
    """Every window, shuffled: the blocks of a group are read together (one
    request of them all for TFRecord and Parquet, all at once for Zarr), far
    more bytes than the link sends in a request's limit."""
    link, bucket, series = stores
    store = _open(link, f"{bucket}/{fmt}", Timeouts(CONNECT, READ))
    sent = link.sent
    x, y = _epoch(store.torch_dataset("train", 4096, seed=1))
    assert_windows_equal(x, y, *_expected(series[fmt]), in_order=False)
    assert link.sent - sent > Timeouts(CONNECT, READ).limit * RATE  # longer than a limit


def test_tf_data_reads_tfrecord_over_a_slow_link(stores: Any) -> None:
    """In order: tf.data reads a TFRecord store's blocks a group at a time."""
    link, bucket, series = stores
    store = _open(link, f"{bucket}/tfrecord", Timeouts(CONNECT, READ))
    x, y = collect_epoch(store.tf_dataset("train", 4096, shuffle=False))
    expected_x, expected_y = _expected(series["tfrecord"])
    np.testing.assert_array_equal(x, expected_x)
    np.testing.assert_array_equal(y, expected_y)


def test_connections_closed_mid_answer_read_on(stores: Any) -> None:
    """A connection closed mid-answer: the read asks for the bytes still to
    come (of the same object), and every window is right."""
    link, bucket, series = stores
    store = _open(link, f"{bucket}/tfrecord", Timeouts(CONNECT, READ))
    store.windows("train", [0])  # its tables read: the cuts fall in reads of blocks
    expected_x, expected_y = _expected(series["tfrecord"])
    wanted = np.arange(3 * BLOCK_ROWS // SPEC.stride)  # the windows of 3 blocks
    link.cut, cuts = 40 << 10, link.cuts  # a block's answer is 64 KiB
    try:
        x, y = store.windows("train", wanted)
    finally:
        link.cut = None
    assert link.cuts - cuts >= 2  # the answers of blocks 1 and 2 (block 0 is held) were cut
    np.testing.assert_array_equal(x, expected_x[wanted])
    np.testing.assert_array_equal(y, expected_y[wanted])


def test_a_read_whose_bytes_cannot_be_watched_gets_time_for_them(
        stores: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a filesystem other than s3fs (plain HTTP here) a read's limit grows
    with its size: 200 KB take longer than the limit on the link, and read."""
    from upath import UPath

    from windowkit.location import read_ranges

    link, bucket, _ = stores
    fs = fsspec.filesystem("s3")
    key = f"{bucket.removeprefix('s3://')}/public"
    data = np.random.default_rng(0).bytes(200_000)
    fs.pipe(key, data)
    fs.chmod(key, acl="public-read")
    monkeypatch.setenv("WINDOWKIT_CONNECT_TIMEOUT", str(STALL.connect))
    monkeypatch.setenv("WINDOWKIT_READ_TIMEOUT", str(STALL.read))
    started = time.monotonic()
    assert read_ranges([UPath(f"{link.endpoint}/{key}")], [0], [len(data)]) == [data]
    assert time.monotonic() - started > STALL.limit


@contextlib.contextmanager
def _stopping(link: SlowLink, after: int) -> Iterator[None]:
    """The link stops sending after ``after`` more bytes, for the block."""
    link.stop_after(after)
    try:
        yield
    finally:
        link.resume()


def _unreachable_in_time(read: Callable[[], object], url: str) -> None:
    """``read`` ends, within the stall timeouts' limit and a little, with one
    StoreUnreachableError line naming ``url`` and the timeouts (tf.data's
    error carries it, as it carries every error of a reader's function)."""
    started = time.monotonic()
    with pytest.raises(Exception) as raised:  # which one: checked below
        read()
    took = time.monotonic() - started
    assert took < STALL.limit + 5, f"took {took:.1f} s"
    message = str(raised.value)
    said = f"the storage endpoint gave no answer within {STALL.limit:g} s"
    if isinstance(raised.value, wk.WindowkitError):
        assert isinstance(raised.value, wk.StoreUnreachableError), repr(raised.value)
        assert "\n" not in message and message.startswith(url) and said in message, message
    else:
        assert "tensorflow" in type(raised.value).__module__, repr(raised.value)
        assert f"StoreUnreachableError: {url}" in message and said in message, message


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_link_that_stops_sending_is_unreachable(stores: Any, fmt: str) -> None:
    """While a store is opened, and mid-answer (20 KiB into a read of blocks)
    through random access; for TFRecord, through the torch and the tf.data
    readers too (their reads of a group of blocks)."""
    link, bucket, _ = stores
    url = f"{bucket}/{fmt}"
    with _stopping(link, 2 << 10):
        _unreachable_in_time(lambda: _open(link, url, STALL).windows("train", [0]), url)
    store = _open(link, url, STALL)
    store.windows("train", [0])  # its tables read: the link stops in a read of blocks
    with _stopping(link, 20 << 10):
        _unreachable_in_time(lambda: store.windows("train", slice(None)), url)
    if fmt != "tfrecord":
        return
    with _stopping(link, 20 << 10):
        _unreachable_in_time(lambda: _epoch(store.torch_dataset("train", 4096, seed=1)), url)
    dataset = store.tf_dataset("train", 4096, shuffle=False)  # TensorFlow imported
    with _stopping(link, 20 << 10):
        _unreachable_in_time(lambda: next(iter(dataset)), url)
