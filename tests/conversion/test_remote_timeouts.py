"""Object storage that stops answering: every read ends with one windowkit line
naming the URL and the timeouts, within them (retries included), never a wait
without end nor "the store was replaced".

The S3 server is a moto server in a process of its own, so that a test can
freeze it (SIGSTOP: connections are still accepted, nothing is answered) or
kill it mid-read; the timeouts are set small through ``storage_options``."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest

import windowkit as wk
from tests.helpers import random_series
from windowkit._requests import CONNECT_TIMEOUT, READ_TIMEOUT, Timeouts
from windowkit.location import resolve
from windowkit.verify import verify_store

pytestmark = pytest.mark.timeout(240)

CONNECT, READ = 1.0, 2.0  # the tests' timeouts (seconds)
STATED_SLACK = 30.0  # what the retries may add to the timeouts, at most
FORMATS = ("zarr", "parquet", "tfrecord")


class MotoServer:
    """A moto S3 server in a child process on 127.0.0.1."""

    def __init__(self) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.endpoint = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(
                    ("127.0.0.1", self.port), timeout=0.5):
                return
            time.sleep(0.1)
        raise RuntimeError("the moto server did not start")

    def options(self, **config: float) -> dict[str, Any]:
        """Storage options that reach this server, with ``config_kwargs`` ``config``."""
        return {"key": "testing", "secret": "testing", "endpoint_url": self.endpoint,
                "config_kwargs": config}

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGCONT)
        self.process.kill()
        self.process.wait(timeout=30)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    """A moto server holding a small store of each format, ``s3://timeouts/<format>``."""
    running = MotoServer()
    try:
        fs = fsspec.filesystem("s3", skip_instance_cache=True, **running.options())
        fs.mkdir("timeouts")
        base = tmp_path_factory.mktemp("stores")
        for fmt in FORMATS:
            store = wk.convert(random_series([3000, 2000]), base / fmt, format=fmt, window=8,
                               block_rows=64)
            fs.put(str(store.path), f"timeouts/{fmt}", recursive=True)
        yield running
    finally:
        running.stop()


@contextlib.contextmanager
def frozen(server: MotoServer) -> Iterator[None]:
    """The server stopped (SIGSTOP) for the block, then let go on."""
    server.process.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        server.process.send_signal(signal.SIGCONT)


def _opened(server: MotoServer, fmt: str) -> wk.Store:
    """The format's store, its tables read (they are read once) and a batch cut."""
    store = wk.open_store(f"s3://timeouts/{fmt}",
                          storage_options=server.options(connect_timeout=CONNECT,
                                                         read_timeout=READ))
    store.windows("train", np.arange(4))
    return store


def _ends_within_the_timeouts(read: Callable[[], object], url: str) -> wk.StoreError:
    """The one line ``read`` ends with, and that it ends in time."""
    started = time.monotonic()
    with pytest.raises(wk.StoreError) as raised:
        read()
    took = time.monotonic() - started
    limit = Timeouts(CONNECT, READ).limit
    assert took <= READ + STATED_SLACK and took < limit + 10, f"took {took:.1f} s"
    message = str(raised.value)
    assert "\n" not in message and message.startswith(url), message
    assert not isinstance(raised.value, wk.StoreReplacedError), message
    return raised.value


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_frozen_server_mid_read_is_one_line_in_time(server: MotoServer, fmt: str) -> None:
    store = _opened(server, fmt)
    url = f"s3://timeouts/{fmt}"
    with frozen(server):
        error = _ends_within_the_timeouts(
            lambda: store.windows("train", np.arange(4000, 4900)), url)
    assert (f"gave no answer within {Timeouts(CONNECT, READ).limit:g} s (connect timeout "
            f"{CONNECT:g} s, read timeout {READ:g} s") in str(error)
    # the server answers again: so does the same store
    assert len(store.windows("train", np.arange(4000, 4100))) == 100


def test_torch_on_a_frozen_server_is_one_line_in_time(server: MotoServer) -> None:
    """The reader that waited 1,174 s and then said "replaced": one line, in time."""
    store = _opened(server, "zarr")
    batches = iter(store.torch_dataset("train", 64, shuffle=False))
    next(batches)
    with frozen(server):
        error = _ends_within_the_timeouts(lambda: list(batches), "s3://timeouts/zarr")
    assert "read timeout 2 s" in str(error)


def test_opening_and_verifying_on_a_frozen_server_is_one_line_in_time(
        server: MotoServer) -> None:
    url = "s3://timeouts/parquet"
    options = server.options(connect_timeout=CONNECT, read_timeout=READ)
    assert verify_store(url, storage_options=options) == []
    with frozen(server):
        error = _ends_within_the_timeouts(lambda: _opened(server, "parquet"), url)
        started = time.monotonic()
        problems = verify_store(url, storage_options=options)
        took = time.monotonic() - started
    assert isinstance(error, wk.StoreUnreachableError), repr(error)
    assert took < Timeouts(CONNECT, READ).limit + 10, f"took {took:.1f} s"
    assert len(problems) == 1 and problems[0].startswith(url), problems
    assert "gave no answer" in problems[0], problems


def test_a_server_killed_mid_read_is_one_line(tmp_path: Path) -> None:
    """The store guard's question (the manifest's ETag) and a read: one line each,
    naming the URL (no botocore error, no "replaced")."""
    doomed = MotoServer()
    try:
        fs = fsspec.filesystem("s3", skip_instance_cache=True, **doomed.options())
        fs.mkdir("doomed")
        local = wk.convert(random_series([3000]), tmp_path / "s", format="zarr", window=8,
                           block_rows=64)
        fs.put(str(local.path), "doomed/s", recursive=True)
        store = wk.open_store("s3://doomed/s", storage_options=doomed.options(
            connect_timeout=CONNECT, read_timeout=READ))
        store.windows("train", np.arange(4))
        doomed.process.kill()
        doomed.process.wait(timeout=30)
        error = _ends_within_the_timeouts(lambda: store.guard.check(fresh=True), "s3://doomed/s")
        assert isinstance(error, wk.StoreUnreachableError), repr(error)
        _ends_within_the_timeouts(lambda: store.windows("train", np.arange(2000, 2900)),
                                  "s3://doomed/s")
    finally:
        doomed.stop()


def test_the_timeouts_are_stated_and_can_be_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """Defaults, ``config_kwargs`` (as botocore takes them), the environment; s3fs
    gets the same ones for its own (per-attempt) timeouts; a bad one is one line."""
    monkeypatch.delenv("WINDOWKIT_CONNECT_TIMEOUT", raising=False)
    monkeypatch.delenv("WINDOWKIT_READ_TIMEOUT", raising=False)
    assert Timeouts.of({}) == Timeouts(CONNECT_TIMEOUT, READ_TIMEOUT) == Timeouts(10.0, 60.0)
    assert Timeouts(10.0, 60.0).limit == 70.0 <= READ_TIMEOUT + STATED_SLACK
    path = resolve("s3://bucket/store")
    assert dict(path.storage_options)["config_kwargs"] == {"connect_timeout": 10.0,
                                                           "read_timeout": 60.0}
    monkeypatch.setenv("WINDOWKIT_READ_TIMEOUT", "5")
    assert Timeouts.of({}) == Timeouts(10.0, 5.0)
    given = {"config_kwargs": {"read_timeout": 7, "retries": {"max_attempts": 2}}}
    assert Timeouts.of(given) == Timeouts(10.0, 7.0)
    path = resolve("s3://bucket/store", given)
    assert dict(path.storage_options)["config_kwargs"] == {
        "connect_timeout": 10.0, "read_timeout": 7, "retries": {"max_attempts": 2}}
    assert path.fs.config_kwargs["read_timeout"] == 7  # what botocore is given
    monkeypatch.setenv("WINDOWKIT_CONNECT_TIMEOUT", "soon")
    with pytest.raises(wk.InvalidSpecError, match=r"^WINDOWKIT_CONNECT_TIMEOUT must be a "
                                                  r"number of seconds > 0, got 'soon'$"):
        wk.open_store("s3://bucket/store")
    monkeypatch.delenv("WINDOWKIT_CONNECT_TIMEOUT")
    with pytest.raises(wk.InvalidSpecError, match="'read_timeout' must be a number"):
        resolve("s3://bucket/store", {"config_kwargs": {"read_timeout": -1}})
