"""Conversion on a Dask cluster: a ``LocalCluster`` of 2 worker processes the
tests start themselves; the store equals a local conversion byte for byte."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import windowkit as wk
from tests.helpers import file_tree
from windowkit.cli import main

distributed = pytest.importorskip("distributed")


@pytest.fixture(scope="module")
def cluster(s3_server: str) -> object:
    """2 worker processes; they inherit the local S3 server's environment."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  host="127.0.0.1", dashboard_address=None) as local:
        yield local


def _npy_sources(directory: Path) -> list[Path]:
    rng = np.random.default_rng(5)
    directory.mkdir()
    paths = []
    for k, n in enumerate([3000, 1700, 900]):
        path = directory / f"s{k}.npy"
        np.save(path, rng.normal(size=(n, 4)).astype(np.float32))
        paths.append(path)
    return paths


def _on_dask_to_s3(tmp_path: Path, cluster: object, url: str,
                   options: dict[str, object]) -> wk.Store:
    """Convert the test sources locally and on the cluster to ``url``; assert the
    uploaded store equals the local one byte for byte; the local store."""
    import fsspec

    sources = [str(p) for p in _npy_sources(tmp_path / "src")]
    local = wk.convert(sources, tmp_path / "local", **options)
    with distributed.Client(cluster, set_as_default=False) as client:
        wk.convert(sources, url, dask=client, **options)
    fs = fsspec.filesystem("s3")
    for name, data in file_tree(local.path).items():
        assert fs.cat(f"{url.removeprefix('s3://')}/{name}") == data, name
    return local


# per format: each format's part writer is shipped to the dask workers
def test_dask_gives_the_store_a_local_conversion_gives(tmp_path: Path, fmt: str,
                                                       cluster: object) -> None:
    sources = [str(p) for p in _npy_sources(tmp_path / "src")]
    options = {"format": fmt, "window": wk.WindowSpec(16, horizon=2), "block_rows": 256,
               "parts": 5, "splits": {"train": 0.8, "val": 0.2}}
    local = wk.convert(sources, tmp_path / "local", **options)
    with distributed.Client(cluster, set_as_default=False) as client:
        on_dask = wk.convert(sources, tmp_path / "dask", dask=client, **options)
        assert len(client.scheduler_info()["workers"]) == 2
    assert file_tree(on_dask.path) == file_tree(local.path)


def test_dask_workers_upload_their_parts_to_s3(tmp_path: Path, cluster: object,
                                                s3_bucket: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """With an s3:// target each worker uploads the part it wrote; the
    published store equals a local conversion byte for byte."""
    import fsspec

    monkeypatch.setenv("WINDOWKIT_CACHE", str(tmp_path / "cache"))
    url = f"{s3_bucket}/store"
    _on_dask_to_s3(tmp_path, cluster, url,
                   {"format": "tfrecord", "window": 16, "block_rows": 256, "parts": 4})
    fs = fsspec.filesystem("s3")
    assert not fs.exists(url.removeprefix("s3://") + ".windowkit-partial")


def test_the_cli_takes_a_scheduler_address(tmp_path: Path, cluster: object) -> None:
    sources = [str(p) for p in _npy_sources(tmp_path / "src")]
    address = cluster.scheduler_address  # type: ignore[attr-defined]
    result = CliRunner().invoke(main, ["convert", *sources, "--format", "parquet", "--out",
                                       str(tmp_path / "s"), "--window", "8", "--parts", "3",
                                       "--dask", address, "--quiet"])
    assert result.exit_code == 0, result.output
    assert wk.open_store(tmp_path / "s").num_windows("train") == (3000 + 1700 + 900) - 3 * 7


def test_a_scheduler_that_does_not_answer_is_one_line(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    from windowkit.conversion import _dask

    # Dask retries a refused connection until its timeout: 2 s here, not 10
    monkeypatch.setattr(_dask, "CONNECT_TIMEOUT", "2s")

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    sources = [str(p) for p in _npy_sources(tmp_path / "src")]
    result = CliRunner().invoke(main, ["convert", *sources, "--format", "zarr", "--out",
                                       str(tmp_path / "s"), "--window", "8", "--dask",
                                       f"tcp://127.0.0.1:{closed}", "--quiet"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "no Dask scheduler answers" in lines[0], result.output
    assert not (tmp_path / "s").exists()
    assert not list(tmp_path.glob(".s.windowkit-partial*"))


def test_forecasting_stores_on_dask_and_s3_equal_a_local_conversion(
        tmp_path: Path, concept_format: str, cluster: object, s3_bucket: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Known-future and static columns and history-context splits: converted
    on the cluster to s3://, the store equals a local conversion byte for
    byte, and reads the same dict batches."""
    monkeypatch.setenv("WINDOWKIT_CACHE", str(tmp_path / "cache"))
    url = f"{s3_bucket}/forecast-{concept_format}"
    local = _on_dask_to_s3(tmp_path, cluster, url, {
        "format": concept_format, "window": wk.WindowSpec(16,
                                                          horizon=3), "block_rows": 256, "parts": 3,
        "splits": "train=0.8,val=0.2", "split_context": "history", "target_columns": ["0"],
        "known_columns": ["2", "3"], "static": {"size": [1.0, 2.0, 3.0]}})
    remote = wk.open_store(url)
    positions = np.arange(remote.num_windows("val"))
    assert len(positions) > 0
    (got, got_y), (want, want_y) = (s.windows("val", positions) for s in (remote, local))
    assert set(got) == {"inputs", "future_known", "static", "series"}
    for key in got:
        np.testing.assert_array_equal(got[key], want[key])
    np.testing.assert_array_equal(got_y, want_y)
