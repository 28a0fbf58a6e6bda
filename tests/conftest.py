"""Shared fixtures: the NumPy window oracle, the format parametrization and the
one format that concept tests run on.

Two kinds of tests: *format contracts* (tests/format_contract.py, ``FormatTests``)
pin down how a format writes, reads and verifies bytes and run once per format
(tests/formats/test_format_<name>.py); *concept tests* (splits, tables, forecasting,
shuffling, sharding, ...) run on ``concept_format`` only, unless a test exercises
something that differs per format (then it takes ``fmt`` and says why)."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

import windowkit as wk

settings.register_profile(
    "windowkit", deadline=None, max_examples=25, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile("windowkit")

#: Every format this version implements; a new format joins the shared suite here.
IMPLEMENTED_FORMATS = sorted(wk.FORMATS)


#: The one format concept tests run on: their behaviour does not depend on the
#: format beyond what FormatTests checks for every format.
CONCEPT_FORMAT = "zarr"


@pytest.fixture(params=IMPLEMENTED_FORMATS)
def fmt(request: pytest.FixtureRequest) -> str:
    """Every implemented format, for a test whose behaviour differs per format
    (FormatTests overrides it with its ``format_name``)."""
    return str(request.param)


@pytest.fixture
def concept_format() -> str:
    """The format a concept test runs on (:data:`CONCEPT_FORMAT`)."""
    return CONCEPT_FORMAT


def npy_sources(tmp: Path) -> list[Path]:
    """Three float32 ``.npy`` series (3000, 1700 and 40 rows of 3 features) in ``tmp``."""
    rng = np.random.default_rng(0)
    paths = []
    for name, rows in [("a", 3000), ("b", 1700), ("c", 40)]:
        path = tmp / f"{name}.npy"
        np.save(path, rng.normal(size=(rows, 3)).astype(np.float32))
        paths.append(path)
    return paths


@pytest.fixture
def sources(tmp_path: Path) -> list[Path]:
    """:func:`npy_sources` in ``tmp_path / "src"``."""
    (tmp_path / "src").mkdir()
    return npy_sources(tmp_path / "src")


@pytest.fixture
def mirror_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private ``WINDOWKIT_CACHE`` for remote conversions."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("WINDOWKIT_CACHE", str(cache))
    return cache


def oracle_windows(series: Sequence[np.ndarray], spec: wk.WindowSpec
                   ) -> tuple[np.ndarray, np.ndarray | None]:
    """Every window of every series, in index order, cut one by one, as the
    README's window semantics say."""
    L, S, R, H = spec.length, spec.stride, spec.sampling_rate, spec.horizon  # noqa: N806
    xs, ys = [], []
    for values in series:
        for r in range(0, len(values) - (L + H - 1) * R, S):
            xs.append(values[r: r + L * R: R])
            ys.append(values[r + L * R: r + (L + H) * R: R])
    step = series[0].shape[1:]
    dtype = series[0].dtype
    x = np.stack(xs) if xs else np.empty((0, L, *step), dtype=dtype)
    if H == 0:
        return x, None
    return x, (np.stack(ys) if ys else np.empty((0, H, *step), dtype=dtype))


def oracle_windows_within(values: np.ndarray, spec: wk.WindowSpec,
                          stretches: Sequence[tuple[int, int]]) -> np.ndarray:
    """The inputs of the windows of one series on its own stride grid (Keras'
    windows of the whole series) that lie wholly inside one of ``stretches``
    (row ranges): what splits, gaps and skipped rows leave."""
    x, _ = oracle_windows([values], spec)
    starts = np.arange(len(x), dtype=np.int64) * spec.stride
    keep = np.zeros(len(x), dtype=bool)
    for a, b in stretches:
        keep |= (starts >= a) & (starts + spec.span <= b)
    return x[keep]


def window_keys(x: np.ndarray, y: np.ndarray | None = None) -> list[bytes]:
    """One bytes key per window (inputs and targets), to compare epochs as multisets."""
    flat = x.reshape(len(x), -1)
    if y is not None:
        flat = np.concatenate([flat, y.reshape(len(y), -1)], axis=1)
    return [row.tobytes() for row in np.ascontiguousarray(flat)]


def assert_windows_equal(x: np.ndarray, y: np.ndarray | None, expected_x: np.ndarray,
                         expected_y: np.ndarray | None, *, in_order: bool) -> None:
    """A reader's epoch holds exactly the oracle's windows: in index order, or
    (shuffled) as the same multiset."""
    if in_order:
        np.testing.assert_array_equal(x, expected_x)
        if expected_y is not None:
            np.testing.assert_array_equal(y, expected_y)
    else:
        assert sorted(window_keys(x, y)) == sorted(window_keys(expected_x, expected_y))


def collect_epoch(ds: object) -> tuple[np.ndarray, np.ndarray | None]:
    """Concatenate every batch of one pass over a tf.data.Dataset."""
    xs, ys = [], []
    for batch in ds:  # type: ignore[attr-defined]
        if isinstance(batch, tuple):
            xs.append(batch[0].numpy())
            ys.append(batch[1].numpy())
        else:
            xs.append(batch.numpy())
    x = np.concatenate(xs) if xs else np.empty((0,))
    return x, (np.concatenate(ys) if ys else None)


@pytest.fixture(scope="session")
def s3_server() -> object:
    """A local S3 server (moto) on 127.0.0.1 and a free port, reached the way
    users reach theirs: ``AWS_ENDPOINT_URL`` and the AWS credential variables.
    Yields its endpoint URL; every test makes its own bucket."""
    import logging
    import socket

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    saved = {k: os.environ.get(k) for k in S3_ENVIRONMENT}
    os.environ.update(S3_ENVIRONMENT, AWS_ENDPOINT_URL=endpoint)
    try:
        yield endpoint
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


S3_ENVIRONMENT = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                  "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": ""}


@pytest.fixture
def s3_bucket(s3_server: str, request: pytest.FixtureRequest) -> str:
    """A new, empty bucket on the local S3 server: ``s3://NAME``."""
    import re
    import uuid

    import fsspec

    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")
    bucket = f"{name}-{uuid.uuid4().hex[:8]}"
    fsspec.filesystem("s3").mkdir(bucket)
    return f"s3://{bucket}"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test class's or module's ``FAST_IDS`` (test name -> parameter ids) keeps those cases in
    the fast suite and marks the test's other cases ``slow`` (``make test-slow``):
    each format and mode still runs there, the long cross product does not."""
    for item in items:
        owner = getattr(item, "cls", None) or getattr(item, "module", None)
        fast = getattr(owner, "FAST_IDS", {}).get(getattr(item, "originalname", None))
        callspec = getattr(item, "callspec", None)
        if fast is not None and callspec is not None and callspec.id not in fast:
            item.add_marker(pytest.mark.slow)
