"""Stores on object storage: every format read from ``s3://`` through both
readers, against a local S3 server the tests start themselves."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import fsspec
import numpy as np
import pytest
from click.testing import CliRunner

import windowkit as wk
from tests.conftest import oracle_windows
from tests.helpers import random_series, upload
from windowkit.cli import main


def test_inspect_and_verify_take_a_url(tmp_path: Path, s3_bucket: str) -> None:
    local = wk.convert(random_series([300]), tmp_path / "s", format="parquet", window=8)
    url = f"{s3_bucket}/s"
    upload(local.path, url)
    runner = CliRunner()
    result = runner.invoke(main, ["inspect", url])
    assert result.exit_code == 0, result.output
    assert "parquet" in result.output
    result = runner.invoke(main, ["verify", "--quiet", url])
    assert result.exit_code == 0, result.output
    fs = fsspec.filesystem("s3")
    part = next(p for p in fs.find(url.removeprefix("s3://") + "/data"))
    fs.pipe(part, fs.cat(part)[:-3])
    result = runner.invoke(main, ["verify", "--quiet", url])
    assert result.exit_code == 1
    assert "holds" in result.output and "bytes" in result.output


@pytest.mark.parametrize("case", ["unknown scheme", "missing bucket", "no store"])
def test_a_bad_url_is_one_line_and_exit_2(s3_bucket: str, case: str) -> None:
    url = {"unknown scheme": "nosuchscheme://bucket/store",
           "missing bucket": "s3://no-such-bucket-windowkit/store",
           "no store": f"{s3_bucket}/nothing-here"}[case]
    result = CliRunner().invoke(main, ["inspect", url])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and url in lines[0] and "Traceback" not in result.output
    with pytest.raises(wk.WindowkitError):
        wk.open_store(url)


def _cli_in_a_clean_environment(args: list[str], **environment: str
                                ) -> subprocess.CompletedProcess[str]:
    """The CLI in a child whose AWS settings are only ``environment``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_SHARED_CREDENTIALS_FILE=os.devnull, AWS_CONFIG_FILE=os.devnull,
               AWS_EC2_METADATA_DISABLED="true", AWS_MAX_ATTEMPTS="1", **environment)
    code = "from windowkit.cli import main; main()"
    return subprocess.run([sys.executable, "-c", code, *args], env=env, text=True,
                          capture_output=True, timeout=120)


def test_no_credentials_is_one_line(tmp_path: Path, s3_bucket: str, s3_server: str) -> None:
    local = wk.convert(random_series([200]), tmp_path / "s", format="zarr", window=8)
    upload(local.path, f"{s3_bucket}/s")
    done = _cli_in_a_clean_environment(["inspect", f"{s3_bucket}/s"],
                                       AWS_ENDPOINT_URL=s3_server)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "no credentials" in done.stderr, done.stderr


def test_an_unreachable_endpoint_is_one_line() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    done = _cli_in_a_clean_environment(
        ["inspect", "s3://bucket/store"], AWS_ENDPOINT_URL=f"http://127.0.0.1:{closed}",
        AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1")
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "cannot reach" in done.stderr, done.stderr


def test_storage_options_reach_the_filesystem(tmp_path: Path, s3_bucket: str,
                                              s3_server: str) -> None:
    local = wk.convert(random_series([200]), tmp_path / "s", format="tfrecord", window=8)
    upload(local.path, f"{s3_bucket}/s")
    options = {"key": "testing", "secret": "testing", "endpoint_url": s3_server}
    store = wk.open_store(f"{s3_bucket}/s", storage_options=options)
    assert store.num_windows("train") == 193
    with pytest.raises(wk.InvalidSpecError, match="storage_options apply to URLs only"):
        wk.open_store(local.path, storage_options=options)


def test_overwrite_rules_hold_for_a_remote_target(s3_bucket: str, mirror_cache: Path) -> None:
    url = f"{s3_bucket}/s"
    runner = CliRunner()
    npy = mirror_cache.parent / "a.npy"
    np.save(npy, np.arange(300, dtype=np.float32).reshape(100, 3))
    args = ["convert", str(npy), "--format", "zarr", "--out", url, "--window", "4", "--quiet"]
    assert runner.invoke(main, args).exit_code == 0
    again = runner.invoke(main, args)
    assert again.exit_code == 2 and "pass --overwrite" in again.output
    assert runner.invoke(main, [*args, "--overwrite"]).exit_code == 0
    fs = fsspec.filesystem("s3")
    fs.pipe(f"{url.removeprefix('s3://')}/thesis.txt", b"mine")
    refused = runner.invoke(main, [*args, "--overwrite"])
    assert refused.exit_code == 2 and "'thesis.txt' is not one of its files" in refused.output
    assert fs.cat(f"{url.removeprefix('s3://')}/thesis.txt") == b"mine"
    assert wk.open_store(url).num_windows("train") == 97


def test_a_second_conversion_to_one_target_fails_at_once(s3_bucket: str,
                                                         mirror_cache: Path) -> None:
    url = f"{s3_bucket}/s"
    fs = fsspec.filesystem("s3")
    fs.pipe(url.removeprefix("s3://") + ".windowkit-lock", b"{}")  # a conversion running
    with pytest.raises(wk.StoreExistsError, match="another conversion to this target"):
        wk.convert(random_series([100]), url, format="zarr", window=4)
    assert not fs.exists(url.removeprefix("s3://"))


def test_an_interrupted_upload_leaves_no_store_and_resumes(
        s3_bucket: str, mirror_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from windowkit.conversion import _remote

    url = f"{s3_bucket}/s"
    series = random_series([400])
    commit = _remote.commit

    def connection_lost(*args: object) -> None:
        raise KeyboardInterrupt  # the upload dies before the manifest

    monkeypatch.setattr(_remote, "commit", connection_lost)
    with pytest.raises(KeyboardInterrupt):
        wk.convert(series, url, format="parquet", window=8)
    with pytest.raises(wk.StoreError, match="not a windowkit store"):
        wk.open_store(url)
    assert fsspec.filesystem("s3").exists(f"{url.removeprefix('s3://')}/{_remote.INCOMPLETE}")
    monkeypatch.setattr(_remote, "commit", commit)
    notes = f"{url.removeprefix('s3://')}/notes.txt"  # a user's object, put there meanwhile
    fsspec.filesystem("s3").pipe(notes, b"mine")
    with pytest.raises(wk.StoreExistsError, match=r"'notes\.txt' is not one of its files"):
        wk.convert(series, url, format="parquet", window=8)
    assert fsspec.filesystem("s3").cat(notes) == b"mine"
    fsspec.filesystem("s3").rm_file(notes)
    store = wk.convert(series, url, format="parquet", window=8)  # the same command again
    np.testing.assert_array_equal(store.windows("train", np.arange(393)),
                                  oracle_windows(series, wk.WindowSpec(8))[0])


def test_sources_are_read_from_s3(tmp_path: Path, s3_bucket: str, mirror_cache: Path) -> None:
    """A .npy glob, a CSV (plain and gzip-compressed) and a Parquet table on
    object storage convert to the same windows as their local copies."""
    import pandas as pd

    fs = fsspec.filesystem("s3")
    bucket = s3_bucket.removeprefix("s3://")
    arrays = random_series([300, 150])
    for k, values in enumerate(arrays):
        buffer = tmp_path / f"a{k}.npy"
        np.save(buffer, values)
        fs.put_file(str(buffer), f"{bucket}/npy/a{k}.npy")
    store = wk.convert(f"{s3_bucket}/npy/a*.npy", tmp_path / "npy", format="zarr", window=8)
    np.testing.assert_array_equal(store.windows("train", np.arange(store.num_windows("train"))),
                                  oracle_windows(arrays, wk.WindowSpec(8))[0])
    frame = pd.DataFrame({"sensor": np.repeat(["a", "b"], 60), "t": np.tile(np.arange(60), 2),
                          "x": np.arange(120, dtype=np.float64),
                          "y": -np.arange(120, dtype=np.float64)})
    frame.to_csv(tmp_path / "long.csv", index=False)
    frame.to_csv(tmp_path / "long.csv.gz", index=False)
    frame.to_parquet(tmp_path / "long.parquet", index=False)
    for name in ("long.csv", "long.csv.gz", "long.parquet"):
        fs.put_file(str(tmp_path / name), f"{bucket}/tables/{name}")
        options = {"format": "parquet", "window": 5, "series_col": "sensor", "time_col": "t"}
        remote = wk.convert(f"{s3_bucket}/tables/{name}", tmp_path / f"r-{name}", **options)
        local = wk.convert(tmp_path / name, tmp_path / f"l-{name}", **options)
        n = local.num_windows("train")
        np.testing.assert_array_equal(remote.windows("train", np.arange(n)),
                                      local.windows("train", np.arange(n)))
    with pytest.raises(wk.SourceNotFoundError, match="no such file"):
        wk.convert(f"{s3_bucket}/tables/missing.csv", tmp_path / "m", format="zarr", window=4)


_SLOW_CHILD = """
import sys, time
import numpy as np
import windowkit as wk
from windowkit.formats import get_format

storage = type(get_format("parquet"))
original = storage.write_part
def slow_write_part(self, *args):
    time.sleep(0.3)
    return original(self, *args)
storage.write_part = slow_write_part
rows = np.arange(6000, dtype=np.float32).reshape(2000, 3)
wk.convert({"a": rows}, sys.argv[1], format="parquet", window=8, block_rows=128, parts=6)
"""


def test_a_remote_conversion_killed_mid_way_leaves_no_store_and_resumes(
        s3_bucket: str, mirror_cache: Path) -> None:
    """kill -9 after 3 of 6 parts were uploaded: nothing opens under the target;
    the same command finishes the store, reusing the uploaded parts."""
    import signal
    import time

    from windowkit.conversion._remote import local_mirror
    from windowkit.location import resolve

    url = f"{s3_bucket}/killed"
    resume = local_mirror(resolve(url))
    resume = resume.parent / f".{resume.name}.windowkit-partial" / "_resume"
    env = {**os.environ, "WINDOWKIT_CACHE": str(mirror_cache)}
    child = subprocess.Popen([sys.executable, "-c", _SLOW_CHILD, url], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while len(list(resume.glob("shard-*.json"))) < 3 and child.poll() is None:
        assert time.monotonic() < deadline, "the conversion made no progress"
        time.sleep(0.01)
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert 3 <= len(list(resume.glob("shard-*.json"))) < 6, "the kill landed too late"
    with pytest.raises(wk.StoreError, match="not a windowkit store"):
        wk.open_store(url)
    fs = fsspec.filesystem("s3")
    uploaded = fs.find(url.removeprefix("s3://") + ".windowkit-partial")
    assert len(uploaded) >= 3
    assert fs.exists(url.removeprefix("s3://") + ".windowkit-lock")  # the killed run's
    again = subprocess.run([sys.executable, "-c", _SLOW_CHILD, url], env=env,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    rows = np.arange(6000, dtype=np.float32).reshape(2000, 3)
    store = wk.open_store(url)
    np.testing.assert_array_equal(store.windows("train", np.arange(1993)),
                                  oracle_windows([rows], wk.WindowSpec(8))[0])


def test_bench_takes_a_url(tmp_path: Path, s3_bucket: str) -> None:
    local = wk.convert(random_series([600]), tmp_path / "s", format="tfrecord", window=8,
                       block_rows=64)
    upload(local.path, f"{s3_bucket}/s")
    result = CliRunner().invoke(main, ["bench", f"{s3_bucket}/s", "--batch-size", "16",
                                       "--batches", "5", "--warmup", "1", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["run"]["windows_s"] > 0


def test_remote_parquet_reads_a_files_footer_once(tmp_path: Path, s3_bucket: str,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    """A remote Parquet reader reads each file's footer once (its copies too), then
    one ranged request per run of row groups; bytes that do not parse are one error."""
    import copy
    import logging

    series = random_series([600, 500])
    url = f"{s3_bucket}/footers"
    upload(wk.convert(series, tmp_path / "s", format="parquet", window=8, block_rows=50,
                       parts=2).path, url)
    store = wk.open_store(url)
    caplog.set_level(logging.DEBUG, logger="s3fs")

    def data_requests() -> list[str]:  # what s3fs asked of the data files
        return [r.getMessage() for r in caplog.records
                if "CALL:" in r.getMessage() and "/data/part-" in r.getMessage()]

    expected = np.concatenate(series)
    reader = store.row_reader()
    np.testing.assert_array_equal(reader.read_rows(0, 1100), expected)
    first_pass = len(data_requests())
    twin = copy.copy(reader)
    np.testing.assert_array_equal(twin.read_rows(120, 980), expected[120:980])
    # the footers were learnt once: the copy asks only for the row groups it reads,
    # rows 120..980 being one run of row groups in each of the two files
    later = data_requests()[first_pass:]
    assert len(later) == 2 and all("get_object" in r and "Range" in r for r in later), later
    part = sorted(p for p in fsspec.filesystem("s3").find(url.removeprefix("s3://") + "/data")
                  if p.endswith(".parquet"))
    fs = fsspec.filesystem("s3")
    blob = bytearray(fs.cat(part[1]))
    import pyarrow.parquet as pq

    first_values = pq.ParquetFile(tmp_path / "s" / "data" / "part-00001.parquet"
                                  ).metadata.row_group(0).column(2).data_page_offset
    blob[first_values + 40:first_values + 100] = bytes(60)  # a value page of row group 0
    fs.pipe(part[1], bytes(blob))
    entry = store.manifest.data["files"][1]
    fresh = wk.open_store(url).row_reader()
    with pytest.raises(wk.StoreError, match=r"part-00001\.parquet: cannot read row group"):
        fresh.read_rows(entry["first_row"], entry["first_row"] + 10)
