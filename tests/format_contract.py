"""The format contract: what every format promises, as one suite of tests.

``FormatTests`` (modelled on zarr-python's ``StoreTests``) holds every test of
how a format writes, reads and verifies bytes: round trips of rows and windows
against the NumPy oracle through random access and both readers (tf.data and
Keras), every dtype and step shape bit for bit, compression options, the
stores' files and manifest, parallel conversion, resuming, ``verify`` and the
detection of damaged, tampered, swapped or replaced files, and stores on S3.
Each format is a small subclass in ``tests/formats/test_format_<name>.py`` naming its
``format_name`` (plus what only that format promises); a new format passes the
contract by adding such a file.

Concept tests (splits, tables, forecasting, shuffling, sharding, ...) run on
one format (``concept_format``, tests/conftest.py), the contract making the
others equivalent.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import pickle
import shutil
import tempfile
from pathlib import Path
from typing import Any, ClassVar

import fsspec
import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import windowkit as wk
from tests.conftest import assert_windows_equal, collect_epoch, oracle_windows
from tests.helpers import (
    ALL_DTYPES,
    SPEC,
    assert_one_line_error,
    check_normalized,
    convert_sources,
    damage_a_block,
    datasets,
    dtype_series,
    file_tree,
    graph_ops,
    interrupted_convert,
    leftovers,
    normalized,
    numbered_series,
    random_series,
    snapshot,
    sorted_rows,
    upload,
)
from windowkit.cli import main
from windowkit.formats import get_format
from windowkit.readers.epoch.sampler import Sampler
from windowkit.readers.keras_pydataset import WindowPyDataset
from windowkit.store import Windows
from windowkit.verify import verify_store


def _convert_series(tmp: str, fmt: str, series: list[np.ndarray], spec: wk.WindowSpec,
             block_rows: int | None = None) -> wk.Store:
    return wk.convert(series, Path(tmp) / "store", format=fmt, window=spec,
                      block_rows=block_rows)


def _check_tf_epoch(fmt: str, data: tuple, batch_size: int, shuffle: bool,
                    cache_bytes: int) -> None:
    """One epoch of ``tf_dataset`` over a random store holds the oracle's windows
    (in index order unless shuffled), in as many batches as its cardinality says."""
    series, spec, block_rows = data
    expected_x, expected_y = oracle_windows(series, spec)
    with tempfile.TemporaryDirectory() as tmp:
        store = _convert_series(tmp, fmt, series, spec, block_rows)
        ds = store.tf_dataset("train", batch_size, shuffle=shuffle, seed=3,
                              cache_bytes=cache_bytes)
        assert ds.cardinality().numpy() == -(-len(expected_x) // batch_size)
        x, y = collect_epoch(ds)
    assert x.dtype == series[0].dtype
    assert_windows_equal(x, y, expected_x, expected_y, in_order=not shuffle)


def _bits(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values).view(np.uint8)


def _assert_same_bits(got: np.ndarray | None, expected: np.ndarray | None) -> None:
    """Equal bit for bit (so ``-0.0`` differs from ``0.0``), of one dtype and shape."""
    assert got is not None and expected is not None
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_array_equal(_bits(got), _bits(expected))


def _pair(windows: Windows) -> tuple[np.ndarray, np.ndarray | None]:
    """``(x, y)`` of a reader's ``x`` or ``(x, y)`` (``y`` None without a horizon)."""
    return windows if isinstance(windows, tuple) else (windows, None)


def _keras_epoch(ds: WindowPyDataset) -> tuple[np.ndarray, np.ndarray | None]:
    """Batches ``0 .. len-1`` of a keras_dataset, concatenated."""
    batches = [_pair(ds[i]) for i in range(len(ds))]
    ys = [y for _, y in batches if y is not None]
    return np.concatenate([x for x, _ in batches]), (np.concatenate(ys) if ys else None)


def _check_epoch(got: tuple[np.ndarray, np.ndarray | None], expected_x: np.ndarray,
                 expected_y: np.ndarray | None, *, in_order: bool) -> None:
    x, y = got
    assert x.dtype == expected_x.dtype and (y is None) == (expected_y is None)
    if in_order:
        _assert_same_bits(x, expected_x)
        if expected_y is not None:
            _assert_same_bits(y, expected_y)
    else:  # keys are bytes: the multisets are compared bit for bit
        assert_windows_equal(x, y, expected_x, expected_y, in_order=False)


def _data_and_index_bytes(store: wk.Store) -> dict[str, bytes]:
    return {str(p.relative_to(store.path)): p.read_bytes()
            for p in sorted(store.path.rglob("*")) if p.is_file() and p.suffix != ".json"}


def _damage(path: Path, how: str) -> None:
    if how == "delete":
        path.unlink()
    elif how == "truncate":
        os.truncate(path, path.stat().st_size // 2)
    else:
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x55
        path.write_bytes(bytes(data))


def _read_everything(store: wk.Store) -> tuple[np.ndarray, np.ndarray]:
    x, y = store.windows("train", np.arange(store.num_windows("train")))
    tx, ty = collect_epoch(store.tf_dataset("train", 64, shuffle=False))
    np.testing.assert_array_equal(tx, x)
    np.testing.assert_array_equal(ty, y)
    return x, y


def _edit_manifest(store: Path, edit: Any) -> None:
    path = store / "windowkit.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))


_DATA_PATH = {"tfrecord": ("shards", "path"), "zarr": None, "parquet": ("files", "path")}


def _set_data_path(manifest: dict[str, Any], fmt: str, value: str) -> None:
    if _DATA_PATH[fmt] is None:
        manifest["files"][0]["path"] = value
    else:
        key, field = _DATA_PATH[fmt]  # type: ignore[misc]
        manifest["data"][key][0][field] = value


_TAMPERING = {
    "absolute file path": (lambda m, f: m["files"][0].update(path="/etc/passwd"),
                           "must be relative"),
    "'..' in an index path": (lambda m, f: m["splits"]["train"].update(
        index="../other/index/train.parquet"), "must be relative"),
    "data file of another store": (lambda m, f: _set_data_path(
        m, f, "../other/data/part-00000.parquet"), "must be relative"),
    "huge block_rows": (lambda m, f: m.update(block_rows=2**40), "block_rows"),
    "huge step shape": (lambda m, f: m.update(step_shape=[2**20, 2**20]), "step_shape"),
    "bytes as text": (lambda m, f: m["files"][0].update(bytes="12"), "files.0.bytes"),
    "negative rows": (lambda m, f: m.update(total_rows=-1), "total_rows"),
    "unknown dtype": (lambda m, f: m.update(dtype="object"), "dtype"),
    "unknown field": (lambda m, f: m.update(extra=1), "extra"),
    "NaN statistics": (lambda m, f: m["normalization"].update(
        mean=[float("nan")] * 3), "normalization"),
    "rows that do not add up": (lambda m, f: m.update(total_rows=m["total_rows"] + 1),
                                "rows"),
}


def _replace(store: wk.Store, sources: list[Path], fmt: str) -> None:
    wk.convert([np.load(p) * 2 for p in sources], store.path, format=fmt, window=SPEC,
               block_rows=128, parts=6, overwrite=True)


class FormatTests:
    """The contract every format passes. A subclass sets ``format_name``; each
    test takes the ``fmt`` fixture, which is that name."""

    #: the name of the format under test (a key of ``windowkit.FORMATS``)
    format_name: ClassVar[str]
    #: whether its tf.data reader reads block groups in TensorFlow's own ops
    #: (no Python on the read path) rather than with a numpy_function per group
    reads_groups_in_graph: ClassVar[bool] = False

    @pytest.fixture
    def fmt(self) -> str:
        return self.format_name

    @pytest.fixture
    def reference(self, tmp_path: Path, sources: list[Path], fmt: str) -> dict[str, bytes]:
        """The files of an uninterrupted conversion of ``sources``."""
        return file_tree(convert_sources(sources, tmp_path / "reference", fmt).path)

    # -- 1. write and read: round trips against the oracle, dtypes, files ----------------------

    @given(data=datasets())
    def test_random_access_equals_oracle(self, fmt: str, data: tuple) -> None:
        series, spec, block_rows = data
        expected_x, expected_y = oracle_windows(series, spec)
        with tempfile.TemporaryDirectory() as tmp:
            store = _convert_series(tmp, fmt, series, spec, block_rows)
            assert store.num_windows("train") == len(expected_x)
            assert store.dtype == series[0].dtype
            assert store.step_shape == series[0].shape[1:]
            got = store.windows("train", np.arange(len(expected_x)))
            if spec.horizon:
                assert isinstance(got, tuple)
                np.testing.assert_array_equal(got[0], expected_x)
                np.testing.assert_array_equal(got[1], expected_y)
            else:
                np.testing.assert_array_equal(got, expected_x)
            assert got[0].dtype == series[0].dtype if spec.horizon else got.dtype == series[0].dtype

    # a tf.data pipeline costs ~0.5-1.5 s to build and iterate whatever its size
    # (TFRecord's graph path the most): make test draws 10 stores per format,
    # make test-slow 60 more (..._soak)
    @settings(max_examples=10)
    @given(data=datasets(), batch_size=st.integers(1, 40), shuffle=st.booleans(),
           cache_bytes=st.sampled_from([1, 1 << 12, 1 << 20]))
    def test_tf_dataset_epoch_holds_every_window_once(self, fmt: str, data: tuple, batch_size: int,
                                                      shuffle: bool, cache_bytes: int) -> None:
        _check_tf_epoch(fmt, data, batch_size, shuffle, cache_bytes)

    @pytest.mark.slow
    @settings(max_examples=60)
    @given(data=datasets(), batch_size=st.integers(1, 40), shuffle=st.booleans(),
           cache_bytes=st.sampled_from([1, 1 << 12, 1 << 20]))
    def test_tf_dataset_epoch_holds_every_window_once_soak(
            self, fmt: str, data: tuple, batch_size: int, shuffle: bool, cache_bytes: int) -> None:
        _check_tf_epoch(fmt, data, batch_size, shuffle, cache_bytes)

    # the statistics of float64 extremes overflow: such a store has none, and
    # normalize=True is refused (never NaN)
    @pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
    @pytest.mark.parametrize("dtype", ALL_DTYPES)
    def test_every_dtype_round_trips_bit_exactly(self, fmt: str, dtype: str,
                                                 tmp_path: Path) -> None:
        """Extremes of every dtype come back bit for bit from every reader: random
        access, tf_dataset and keras_dataset, in order and shuffled, with and
        without a horizon (each reader sees both orders across the two stores);
        normalized (float) windows come from random access and keras_dataset."""
        series = dtype_series(dtype)
        for horizon, tf_in_order in ((2, True), (0, False)):
            spec = wk.WindowSpec(5, stride=2, horizon=horizon)
            expected_x, expected_y = oracle_windows(series, spec)
            store = wk.convert(series, tmp_path / f"h{horizon}", format=fmt, window=spec,
                               block_rows=16)
            assert store.dtype == np.dtype(dtype) and store.num_windows("train") == len(expected_x)
            positions = np.arange(len(expected_x))
            got = store.windows("train", positions)
            _check_epoch(_pair(got), expected_x, expected_y, in_order=True)
            ds = store.tf_dataset("train", 32, shuffle=not tf_in_order, seed=1)
            _check_epoch(collect_epoch(ds), expected_x, expected_y, in_order=tf_in_order)
            keras = store.keras_dataset("train", 32, shuffle=tf_in_order, seed=1)
            _check_epoch(_keras_epoch(keras), expected_x, expected_y, in_order=not tf_in_order)
            if store.manifest.normalization is None:
                assert dtype == "float64"
                with pytest.raises(wk.StoreError, match="no normalization statistics"):
                    store.windows("train", positions, normalize=True)
                continue
            expected = normalized(store, expected_x, expected_y)
            got = store.windows("train", positions, normalize=True)
            check_normalized(_pair(got), expected, dtype)
            keras = store.keras_dataset("train", 32, shuffle=False, normalize=True)
            check_normalized(_keras_epoch(keras), expected, dtype)

    def test_store_pickles_and_reopens(self, fmt: str, tmp_path: Path) -> None:
        series = numbered_series([80, 40])
        store = wk.convert(series, tmp_path / "s", format=fmt, window=6, block_rows=8)
        before = store.windows("train", [0, 50, 100])
        clone = pickle.loads(pickle.dumps(store))
        np.testing.assert_array_equal(clone.windows("train", [0, 50, 100]), before)

    def test_index_table_and_manifest(self, fmt: str, tmp_path: Path) -> None:
        series = numbered_series([30, 3, 12])
        spec = wk.WindowSpec(4, stride=3, horizon=1)
        store = wk.convert(series, tmp_path / "s", format=fmt, window=spec)
        index = store.index("train")
        expected = [(s, r, 4) for s, n in enumerate([30, 3, 12]) for r in range(0, n - 4, 3)]
        assert index.tolist() == [list(t) for t in expected]
        info = store.info
        assert info["format"] == fmt and info["format_version"] == 3
        assert info["splits"]["train"]["windows"] == len(expected)
        assert info["series"] == {"count": 3, "too_short": 1, "gap_skipped_windows": 0,
                                  "nan_skipped_windows": 0, "missing_rows": 0}
        assert info["window"] == spec.to_dict()
        assert info["dtype"] == "float64" and info["step_shape"] == [2]
        on_disk = {str(p.relative_to(store.path)) for p in store.path.rglob("*") if p.is_file()}
        assert on_disk - {"windowkit.json"} == {f["path"] for f in info["files"]}
        for entry in info["files"]:
            assert (store.path / entry["path"]).stat().st_size == entry["bytes"]

    @pytest.mark.parametrize("compression", ["zstd", "gzip", "none", "lz4"])
    def test_compressions(self, fmt: str, tmp_path: Path, compression: str) -> None:
        series = numbered_series([100])
        if compression not in get_format(fmt).compressions:
            with pytest.raises(wk.InvalidSpecError,
                               match=f"compression 'lz4' is not valid for {fmt}"):
                wk.convert(series, tmp_path / "s", format=fmt, window=5, compression="lz4")
            assert not (tmp_path / "s").exists() and not list(tmp_path.iterdir())
            return
        store = wk.convert(series, tmp_path / "s", format=fmt, window=5, compression=compression,
                           block_rows=16)
        np.testing.assert_array_equal(store.windows("train", [95])[0], series[0][95:100])

    def test_parallel_convert_writes_the_same_store(self, fmt: str, tmp_path: Path) -> None:
        series = numbered_series([700, 45, 900])
        spec = wk.WindowSpec(6, stride=2, horizon=1)
        one = wk.convert(series, tmp_path / "one", format=fmt, window=spec, block_rows=64,
                         parts=5)
        two = wk.convert(series, tmp_path / "two", format=fmt, window=spec, block_rows=64,
                         parts=5, workers=2)
        assert _data_and_index_bytes(one) == _data_and_index_bytes(two)
        assert one.info["normalization"] == two.info["normalization"]
        assert one.info["data"] == two.info["data"]

    def test_shuffle_blocks_bounds_how_far_windows_travel(self, fmt: str, tmp_path: Path) -> None:
        """With one block per group, each batch's windows come from one or two blocks."""
        rows = np.arange(4096, dtype=np.float32)[:, None]
        store = wk.convert([rows], tmp_path / "s", format=fmt, window=4, block_rows=256)
        starts = collect_epoch(store.tf_dataset("train", 64, shuffle_blocks=1, seed=5))[0][:, 0, 0]
        assert sorted(starts.tolist()) == list(range(4093))
        assert not np.array_equal(starts, np.sort(starts))
        blocks = starts.astype(np.int64) // 256
        assert max(len(np.unique(blocks[i:i + 64])) for i in range(0, len(blocks), 64)) <= 2

    # -- 2. the tf.data reader: its graph and its block order ----------------------------------

    def test_the_epoch_order_is_in_the_graph_and_python_only_reads_groups(self, tmp_path: Path,
                                                                          fmt: str) -> None:
        """No generator: block groups' order is computed by graph ops, and Python
        runs once per group of blocks (a stateless numpy_function reading them),
        or, for a format read in the graph, only to check that the parts a
        group reads are regular files (a parallel interleave of its files reads
        them). A uniform shuffle's order is in the graph too (windowkit's
        compiled op, else its permutation's Feistel rounds), Python handing
        over the held rows once an epoch. Windows are cut by the compiled
        window copy, else by gathers."""
        from windowkit import native

        compiled = native.available()
        store = wk.convert(random_series([500, 300]), tmp_path / "s", format=fmt,
                           window=wk.WindowSpec(8, horizon=1), block_rows=64, parts=2)
        for shuffle in ("blocks", True):
            ops = graph_ops(store.tf_dataset("train", 32, shuffle=shuffle, normalize=True))
            assert not {op for op in ops if "Generator" in op}
            assert ("WindowkitWindowCopy" if compiled else "GatherV2") in ops
            assert "LookupTableFindV2" in ops  # the epoch, from the reader's counter
            if shuffle is True:
                assert "PyFuncStateless" in ops
                assert ({"WindowkitEpochStarts"} if compiled else {"BitwiseXor", "UpperBound"}
                        ) <= ops
            elif self.reads_groups_in_graph:  # Python checks the parts a group reads, no more
                assert {op for op in ops if "PyFunc" in op} == {"PyFunc"}
                assert {op for op in ops if op.startswith("ParallelInterleaveDataset")}
            else:
                assert "PyFuncStateless" in ops

    def test_tf_dataset_visits_blocks_in_the_samplers_order(self, tmp_path: Path, fmt: str) -> None:
        """Every format's tf.data reader follows the sampler: with one block per group,
        an epoch's windows come block by block in the order the sampler gives for
        the epoch, and the next iteration is the next epoch."""
        block_rows, rows = 64, 700
        series = [np.arange(k * rows, (k + 1) * rows, dtype=np.float64)[:, None] for k in range(5)]
        store = wk.convert(series, tmp_path / "s", format=fmt, window=wk.WindowSpec(4),
                           block_rows=block_rows, splits={"train": 0.7, "val": 0.3})
        ds = store.tf_dataset("val", 50, seed=9, shuffle_blocks=1)
        plan = store.read_plan("val")
        counts = np.bincount(plan.runs.global_starts(np.arange(plan.num_windows)) // block_rows,
                             minlength=-(-plan.layout.total_rows // block_rows))
        sampler = Sampler(counts, group=1, shuffle=True, seed=9)
        for epoch in range(2):  # two epochs: two iterations of the dataset
            starts = np.concatenate([x[:, 0, 0] for x in ds.as_numpy_iterator()]).astype(np.int64)
            visited = starts // block_rows
            runs = visited[np.r_[True, visited[1:] != visited[:-1]]]
            assert runs.tolist() == sampler.block_order(epoch).tolist()
            assert len(runs) == np.count_nonzero(counts)  # each block's windows together

    # -- 3. resume and verify: damaged files are named and refused -----------------------------

    def test_resume_after_an_interruption_is_byte_identical(
            self, tmp_path: Path, sources: list[Path], fmt: str, reference: dict[str, bytes],
            monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
        out = tmp_path / "out" / "store"
        interrupted_convert(monkeypatch, sources, out, fmt, parts_done=2)
        assert not out.exists()
        assert leftovers(out.parent) == [".store.windowkit-partial"]
        calls = []
        storage = get_format(fmt)
        original = type(storage).write_part
        monkeypatch.setattr(type(storage), "write_part",
                            lambda self, *a: calls.append(a[2].number) or original(self, *a))
        with caplog.at_level(logging.INFO, logger="windowkit"):
            store = convert_sources(sources, out, fmt)
        assert calls == [2, 3, 4, 5], "finished parts were written again"
        assert "resuming an interrupted conversion: 2 of 6 parts already written" in caplog.text
        assert file_tree(store.path) == reference
        assert leftovers(out.parent) == []
        assert verify_store(out) == []

    def test_a_damaged_finished_part_is_written_again(
            self, tmp_path: Path, sources: list[Path], fmt: str, reference: dict[str, bytes],
            monkeypatch: pytest.MonkeyPatch) -> None:
        out = tmp_path / "store"
        interrupted_convert(monkeypatch, sources, out, fmt, parts_done=3)
        partial = tmp_path / ".store.windowkit-partial"
        part_file = sorted(f for f in (partial / "data").rglob("*") if f.is_file()
                            and f.name not in ("zarr.json",))[0]
        data = bytearray(part_file.read_bytes())
        data[len(data) // 2] ^= 0xFF
        part_file.write_bytes(bytes(data))
        assert file_tree(convert_sources(sources, out, fmt).path) == reference

    @pytest.mark.parametrize("how", ["flip", "truncate", "delete"])
    def test_damaged_data_files_fail_verify_and_reading(self, tmp_path: Path, sources: list[Path],
                                                        fmt: str, how: str) -> None:
        series = [np.load(p) for p in sources]
        expected_x, expected_y = oracle_windows(series, SPEC)
        clean = convert_sources(sources, tmp_path / "clean", fmt)
        data_files = sorted(str(p.relative_to(clean.path)) for p in (clean.path / "data").rglob("*")
                            if p.is_file())
        # a spread of the data files, and the index and series tables
        for name in [*data_files[:: max(1, len(data_files) // 4)], "index/train.parquet",
                     "series.parquet"]:
            store_path = tmp_path / f"{how}-{name.replace('/', '_')}"
            convert_sources(sources, store_path, fmt)
            _damage(store_path / name, how)
            problems = verify_store(store_path)
            assert problems and str(store_path / name) in problems[0], (name, problems)
            result = CliRunner().invoke(main, ["verify", str(store_path), "-q"])
            assert result.exit_code == 1 and str(store_path / name) in result.output
            try:
                x, y = _read_everything(wk.open_store(store_path))
            except (wk.StoreError, OSError, ValueError) as exc:  # tf raises DataLossError etc.
                assert str(exc)
                continue
            except Exception as exc:  # TensorFlow's errors: named, never silent
                assert "tensorflow" in type(exc).__module__, repr(exc)
                continue
            # a damaged byte the reader never needs (e.g. metadata statistics) is harmless
            np.testing.assert_array_equal(x, expected_x)
            np.testing.assert_array_equal(y, expected_y)

    def test_verify_passes_an_intact_store_and_reports_stray_files(self, tmp_path: Path,
                                                                    sources: list[Path],
                                                                    fmt: str) -> None:
        store = convert_sources(sources, tmp_path / "store", fmt)
        result = CliRunner().invoke(main, ["verify", str(store.path)])
        assert result.exit_code == 0 and result.output.endswith(": ok\n")
        (store.path / "data" / "stray.bin").write_bytes(b"x")
        result = CliRunner().invoke(main, ["verify", str(store.path), "-q"])
        assert result.exit_code == 1
        assert f"{store.path / 'data' / 'stray.bin'}: file is not in the manifest" in result.output

    # -- 4. a store is untrusted input: tampered, swapped, replaced ----------------------------

    @pytest.mark.parametrize("case", sorted(_TAMPERING))
    def test_a_tampered_manifest_is_refused_on_open_and_by_verify(
            self, tmp_path: Path, sources: list[Path], fmt: str, case: str) -> None:
        store = convert_sources(sources, tmp_path / "store", fmt)
        edit, needle = _TAMPERING[case]
        _edit_manifest(store.path, lambda m: edit(m, fmt))
        before = snapshot(store.path)
        with pytest.raises(wk.StoreError, match=r"windowkit\.json") as caught:
            wk.open_store(store.path)
        assert needle in str(caught.value) and "\n" not in str(caught.value), str(caught.value)
        problems = verify_store(store.path)
        assert problems == [str(caught.value)]
        result = CliRunner().invoke(main, ["inspect", str(store.path)])
        assert_one_line_error(result, needle)
        assert snapshot(store.path) == before  # opening never writes

    def test_a_link_to_another_stores_file_is_refused_by_its_checksum(
            self, tmp_path: Path, sources: list[Path], fmt: str) -> None:
        """Links are followed (a DVC or git-annex checkout), so what a link
        leads to is checked as a copy would be: another store's file differs
        from the manifest's checksum (``verify``), and a link to a FIFO is one
        line at open."""
        other = convert_sources(sources[:2], tmp_path / "other", fmt)
        store = convert_sources(sources, tmp_path / "store", fmt)
        name = sorted(str(p.relative_to(store.path)) for p in (store.path / "data").rglob("*")
                      if p.is_file())[-1]
        (store.path / name).unlink()
        (store.path / name).symlink_to(other.path / name)
        problems = verify_store(store.path)
        assert len(problems) == 1 and str(store.path / name) in problems[0], problems
        os.mkfifo(tmp_path / "fifo")
        (store.path / name).unlink()
        (store.path / name).symlink_to(tmp_path / "fifo")
        with pytest.raises(wk.StoreError, match=r"is not a regular file \(a FIFO\)"):
            wk.open_store(store.path)

    def test_a_data_file_of_another_store_is_refused_by_readers(
            self, tmp_path: Path, sources: list[Path], fmt: str) -> None:
        """Same name and layout, other rows: the store id in the file tells them apart
        (Zarr chunks carry none; ``verify`` names them by checksum)."""
        other = wk.convert([np.load(p) + 1 for p in sources], tmp_path / "other", format=fmt,
                           window=SPEC, block_rows=128, parts=6)
        store = convert_sources(sources, tmp_path / "store", fmt)
        name = "data/zarr.json" if fmt == "zarr" else next(
            f.path for f in store.manifest.files if f.path.startswith("data/part-"))
        shutil.copyfile(other.path / name, store.path / name)
        assert any(f"{store.path / name}:" in p for p in verify_store(store.path))
        copied = store.path / name
        with pytest.raises(wk.StoreError) as refused:
            store = wk.open_store(store.path)
            store.windows("train", np.arange(store.num_windows("train")))
        # the store id (or, where another id shifts a record's bytes, its framing) tells
        message = str(refused.value)
        assert str(copied) in message, message
        assert any(why in message for why in ("differs from the manifest", "belongs to",
                                              "its header says", "fails its CRC check")), message

    def test_opening_and_reading_never_write(self, tmp_path: Path, sources: list[Path],
                                             fmt: str) -> None:
        store = convert_sources(sources, tmp_path / "store", fmt)
        before = snapshot(tmp_path)
        opened = wk.open_store(store.path)
        opened.windows("train", np.arange(opened.num_windows("train")))
        collect_epoch(opened.tf_dataset("train", 64))
        opened.keras_dataset("train", 64)[0]
        assert verify_store(store.path) == []
        assert CliRunner().invoke(main, ["inspect", str(store.path)]).exit_code == 0
        assert snapshot(tmp_path) == before

    def test_a_memory_error_while_reading_is_not_called_corruption(
            self, tmp_path: Path, sources: list[Path], fmt: str,
            monkeypatch: pytest.MonkeyPatch) -> None:
        store = convert_sources(sources, tmp_path / "store", fmt)
        reader_type = type(store.row_reader().inner)  # the format's reader, inside the checks
        name = {"tfrecord": "_decode", "zarr": "_decode", "parquet": "_read_groups"}[fmt]

        def out_of_memory(*args: object) -> None:
            raise MemoryError("no memory")

        monkeypatch.setattr(reader_type, name, out_of_memory)
        with pytest.raises(MemoryError):
            wk.open_store(store.path).windows("train", np.arange(4))

    def test_a_damaged_block_error_keeps_its_cause(self, tmp_path: Path, sources: list[Path],
                                                   fmt: str) -> None:
        store = convert_sources(sources, tmp_path / "store", fmt)
        damage_a_block(store)
        with pytest.raises(wk.StoreError) as caught:
            wk.open_store(store.path).windows("train", np.arange(store.num_windows("train")))
        assert caught.value.__cause__ is not None

    @pytest.mark.parametrize("reader", ["tf", "keras"])
    def test_bench_of_a_damaged_store_is_one_line(self, tmp_path: Path, sources: list[Path],
                                                  fmt: str,
                                                  reader: str) -> None:
        """The tf.data reader's error comes through TensorFlow (its traceback inside):
        the command still prints the windowkit line alone, naming where in the store
        (the file; for Zarr, the array and its chunks)."""
        store = convert_sources(sources, tmp_path / "store", fmt)
        damage_a_block(store)
        result = CliRunner().invoke(main, ["bench", str(store.path), "--reader", reader,
                                           "--batch-size", "8", "--warmup", "1",
                                           "--shuffle", "none"])
        assert_one_line_error(result, f"windowkit: error: {store.path / 'data'}")

    def test_a_replaced_store_is_an_error_for_random_access(self, tmp_path: Path,
                                                            sources: list[Path],
                                                            fmt: str) -> None:
        store = convert_sources(sources, tmp_path / "store", fmt)
        store.windows("train", np.arange(4))
        _replace(store, sources, fmt)
        with pytest.raises(wk.StoreReplacedError, match="was replaced while it was being read"):
            store.windows("train", np.arange(store.num_windows("train")))

    def test_a_replaced_store_is_an_error_for_tf_dataset(self, tmp_path: Path, sources: list[Path],
                                                         fmt: str) -> None:
        store = convert_sources(sources, tmp_path / "store", fmt)
        iterator = iter(store.tf_dataset("train", 32, shuffle=False, cache_bytes=1))
        next(iterator)
        _replace(store, sources, fmt)
        try:
            with pytest.raises(Exception, match="replaced while it was being read") as caught:
                for _ in iterator:
                    pass
            assert "tensorflow" in type(caught.value).__module__ or isinstance(
                caught.value, wk.StoreReplacedError)
        finally:  # stop its background reads before the next test writes a store
            del iterator, caught
            gc.collect()

    def test_a_replaced_store_is_an_error_for_keras_workers(self, tmp_path: Path,
                                                            sources: list[Path],
                                                            fmt: str) -> None:
        store = convert_sources(sources, tmp_path / "store", fmt)
        dataset = store.keras_dataset("train", 32, cache_bytes=1)
        dataset[0]
        shipped = pickle.dumps(dataset)  # what a worker process receives
        _replace(store, sources, fmt)
        in_worker = pickle.loads(shipped)
        with pytest.raises(wk.StoreReplacedError, match="was replaced"):
            in_worker[1]  # a worker's first read checks the store id
        with pytest.raises(wk.StoreReplacedError, match="was replaced"):
            for i in range(len(dataset)):
                dataset[i]

    # -- 5. stores on S3 -----------------------------------------------------------------------

    def test_every_format_reads_from_s3_through_both_readers(self, tmp_path: Path, fmt: str,
                                                             s3_bucket: str) -> None:
        series = random_series([700, 333, 90])
        spec = wk.WindowSpec(8, stride=2, horizon=2)
        local = wk.convert(series, tmp_path / "s", format=fmt, window=spec, block_rows=64,
                           parts=2)
        url = f"{s3_bucket}/stores/s"
        upload(local.path, url)
        store = wk.open_store(url)
        expected_x, expected_y = oracle_windows(series, spec)
        x, y = store.windows("train", np.arange(store.num_windows("train")))
        np.testing.assert_array_equal(x, expected_x)
        np.testing.assert_array_equal(y, expected_y)
        got_x, got_y = collect_epoch(store.tf_dataset("train", 64, shuffle=False))
        np.testing.assert_array_equal(got_x, expected_x)
        np.testing.assert_array_equal(got_y, expected_y)
        shuffled, _ = collect_epoch(store.tf_dataset("train", 64, seed=3))
        np.testing.assert_array_equal(sorted_rows(shuffled), sorted_rows(expected_x))
        keras = store.keras_dataset("train", 64, seed=1)
        batches = np.concatenate([keras[i][0] for i in range(len(keras))])
        np.testing.assert_array_equal(sorted_rows(batches), sorted_rows(expected_x))
        uniform, _ = collect_epoch(store.tf_dataset("train", 64, shuffle="global", seed=2))
        np.testing.assert_array_equal(sorted_rows(uniform), sorted_rows(expected_x))
        # beyond memory: the rows downloaded once into a local spill, then read
        # locally, in the order of the same permutation held in memory
        held_budget = store.read_plan("train").rows_bytes()  # the rows fit once, not six times
        held, _ = collect_epoch(store.tf_dataset("train", 64, shuffle="global", seed=2,
                                                 memory_budget=held_budget))
        spilled, _ = collect_epoch(store.tf_dataset("train", 64, shuffle="global", seed=2,
                                                    memory_budget=4096))
        assert held_budget > 4096
        np.testing.assert_array_equal(spilled, held)
        shards = [collect_epoch(store.tf_dataset("train", 64, num_shards=2, shard_index=i))[0]
                  for i in range(2)]
        assert len(shards[0]) == len(shards[1])  # a short shard repeats its last window
        both = np.concatenate(shards)
        assert len(both) - len(expected_x) <= 1
        np.testing.assert_array_equal(np.unique(both.reshape(len(both), -1), axis=0),
                                      np.unique(expected_x.reshape(len(expected_x), -1), axis=0))

    def test_every_format_converts_to_s3(self, tmp_path: Path, fmt: str, s3_bucket: str,
                                         mirror_cache: Path) -> None:
        series = random_series([500, 120])
        spec = wk.WindowSpec(6, horizon=1)
        url = f"{s3_bucket}/out/{fmt}"
        store = wk.convert(series, url, format=fmt, window=spec, block_rows=64)
        assert str(store.path) == url
        expected_x, expected_y = oracle_windows(series, spec)
        x, y = wk.open_store(url).windows("train", np.arange(len(expected_x)))
        np.testing.assert_array_equal(x, expected_x)
        np.testing.assert_array_equal(y, expected_y)
        local = wk.convert(series, tmp_path / "local", format=fmt, window=spec, block_rows=64)
        fs = fsspec.filesystem("s3")
        for entry in local.manifest.files:  # the same bytes as a local conversion
            assert fs.cat(f"{url.removeprefix('s3://')}/{entry.path}") == (
                local.path / entry.path).read_bytes()
        assert not list(mirror_cache.glob("remote/*/*"))  # the mirror is gone after the upload
        assert not fs.exists(url.removeprefix("s3://") + ".windowkit-partial")  # and the parts
        assert not fs.exists(url.removeprefix("s3://") + ".windowkit-lock")

    def test_a_replaced_remote_store_is_an_error(self, tmp_path: Path, fmt: str, s3_bucket: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
        """A reader asks for the manifest's ETag at most every REMOTE_CHECK_SECONDS;
        once it does, a store replaced meanwhile is an error, not other rows."""
        from windowkit import guard as manifest

        series = random_series([400, 300])
        url = f"{s3_bucket}/replaced"
        upload(wk.convert(series, tmp_path / "a", format=fmt, window=8, block_rows=64).path, url)
        store = wk.open_store(url)
        reader = store.row_reader()
        np.testing.assert_array_equal(reader.read_rows(0, 64), series[0][:64])
        other = wk.convert(random_series([400, 300], seed=1), tmp_path / "b", format=fmt, window=8,
                           block_rows=64)
        fsspec.filesystem("s3").rm(url.removeprefix("s3://"), recursive=True)
        upload(other.path, url)
        monkeypatch.setattr(manifest, "REMOTE_CHECK_SECONDS", 0.0)
        with pytest.raises(wk.StoreError, match="replaced while it was being read"):
            reader.read_rows(64, 128)
