"""Helpers shared by test modules and the contracts: stores to convert, series
to convert them from, what a conversion leaves, damage to do to a store, and the
CLI's one-line errors. Plain functions; fixtures live in tests/conftest.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import strategies as st

import windowkit as wk
from windowkit.cli import main
from windowkit.formats import get_format

#: The window of the stores :func:`convert_sources` writes.
SPEC = wk.WindowSpec(8, horizon=2)


# -- series to convert ---------------------------------------------------------------------
def free_ports(count: int = 1) -> list[int]:
    """``count`` distinct ports free on 127.0.0.1 now (each bound once, then
    released): safe for tests running side by side, unlike a fixed port."""
    import socket

    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def random_series(lengths: list[int], features: int = 3, seed: int = 0) -> list[np.ndarray]:
    """Float32 series of normal values, one per length, ``features`` wide."""
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(n, features)).astype(np.float32) for n in lengths]


def numbered_series(lengths: list[int], features: int = 2) -> list[np.ndarray]:
    """Series whose every row is unique: value = global row id (and a feature tag)."""
    out, base = [], 0
    for n in lengths:
        rows = np.arange(base, base + n, dtype=np.float64)[:, None]
        out.append(np.concatenate([rows] + [rows + 0.5] * (features - 1), axis=1))
        base += n
    return out


def tagged_series(lengths: list[int]) -> list[np.ndarray]:
    """Series whose feature 0 is the series number and feature 1 the row: a
    window says where it came from."""
    return [np.column_stack([np.full(n, s), np.arange(n), np.sin(np.arange(n) + s)]
                            ).astype(np.float32) for s, n in enumerate(lengths)]


def sorted_rows(x: np.ndarray) -> np.ndarray:
    """The windows of ``x`` flattened to rows, in lexicographic order (to compare multisets)."""
    flat = x.reshape(len(x), -1)
    return flat[np.lexsort(flat.T[::-1])]


def npy_file(name: str, values: np.ndarray) -> Callable[[Path], Path]:
    """A maker of a source file: saves ``values`` as ``name`` in the directory it is given."""
    def make(d: Path) -> Path:
        np.save(d / name, values, allow_pickle=True)
        return d / name
    return make


def text_file(name: str, text: str) -> Callable[[Path], Path]:
    """A maker of a source file: writes ``text`` as ``name`` in the directory it is given."""
    def make(d: Path) -> Path:
        (d / name).write_text(text)
        return d / name
    return make


def long_csv(rows: list[tuple[str, int, str]]) -> str:
    """A long-format CSV (``id,t,v``) of ``(series, time, value)`` rows."""
    return "id,t,v\n" + "".join(f"{s},{t},{v}\n" for s, t, v in rows)


# -- converting, and what a conversion leaves ----------------------------------------------
def convert_sources(sources: list[Path], out: Path, fmt: str, **options: object) -> wk.Store:
    """Convert ``.npy`` sources with :data:`SPEC` (128-row blocks, 6 parts unless given)."""
    options = {"block_rows": 128, "parts": 6, **options}
    return wk.convert([str(p) for p in sources], out, format=fmt, window=SPEC,
                      **options)  # type: ignore[arg-type]


def cli_convert(sources: list[Path], out: Path, fmt: str, *extra: str) -> Any:
    """``windowkit convert SOURCES --format FMT --out OUT --window 8 -q EXTRA``."""
    return CliRunner().invoke(main, ["convert", *map(str, sources), "--format", fmt, "--out",
                                     str(out), "--window", "8", "-q", *extra])


def interrupt_after(monkeypatch: pytest.MonkeyPatch, fmt: str, parts: int) -> None:
    """Make the format's part writer stop (as on Ctrl-C) once ``parts`` are done."""
    storage = get_format(fmt)
    original = type(storage).write_part
    calls = {"n": 0}

    def write_part(self: object, *args: object) -> object:
        if calls["n"] == parts:
            raise KeyboardInterrupt
        calls["n"] += 1
        return original(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(type(storage), "write_part", write_part)


def interrupted_convert(monkeypatch: pytest.MonkeyPatch, sources: list[Path], out: Path,
                        fmt: str, *, parts_done: int) -> None:
    """A conversion stopped by Ctrl-C once ``parts_done`` parts are written."""
    with monkeypatch.context() as patch:
        interrupt_after(patch, fmt, parts_done)
        with pytest.raises(KeyboardInterrupt):
            convert_sources(sources, out, fmt)


def file_tree(root: Path) -> dict[str, bytes]:
    """Every file of a store, by path."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def leftovers(directory: Path) -> list[str]:
    """The hidden entries (workspaces, locks) in ``directory``."""
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


def snapshot(directory: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every entry under ``directory``: size, mtime and (for files) content."""
    out = {}
    for path in sorted(directory.rglob("*")):
        info = path.lstat()
        data = path.read_bytes() if path.is_file() and not path.is_symlink() else b""
        out[str(path.relative_to(directory))] = (info.st_size, info.st_mtime_ns, data)
    return out


def upload(local: Path, url: str) -> None:
    """Copy the store at ``local`` to ``url`` on S3."""
    fsspec.filesystem("s3").put(str(local), url.removeprefix("s3://"), recursive=True)


# -- damage, and the errors it gives -------------------------------------------------------
def damage_a_block(store: wk.Store) -> Path:
    """Flip a byte in the middle of the store's first data file (not its metadata)."""
    damaged = sorted(p for p in (store.path / "data").rglob("*")
                     if p.is_file() and p.name not in ("zarr.json", "records.parquet",
                                                       "_blocks.xxh3"))[0]
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0x55
    damaged.write_bytes(bytes(data))
    return damaged


def assert_one_line_error(result: Any, *needles: str) -> None:
    """A CLI result that exits 2 with one line holding every needle, no traceback."""
    assert result.exit_code == 2, result.output
    assert result.output.count("\n") == 1 and "Traceback" not in result.output, result.output
    for needle in needles:
        assert needle in result.output, (needle, result.output)


# -- every dtype ---------------------------------------------------------------------------
#: Every dtype a store may hold: each must round-trip bit-exactly through every reader.
ALL_DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
              "float16", "float32", "float64"]
DTYPES = [np.dtype(name) for name in ALL_DTYPES]
STEP_SHAPES = st.sampled_from([(), (1,), (3,), (2, 3, 2)])


def dtype_values(dtype: np.dtype, shape: tuple[int, ...], rng: np.random.Generator, *,
                 extremes: bool = False) -> np.ndarray:
    """Random values of ``dtype``: integers over its whole range, bools, floats
    around 0 (with ``extremes``: any finite bit pattern, so every exponent, and
    first the dtype's edge values: min, max, the tiniest normal and subnormal
    numbers, -0.0). Never NaN or infinity, which convert refuses."""
    if dtype.kind == "b":
        values = rng.integers(0, 2, size=shape).astype(dtype)
        edges = np.array([True, False], dtype=dtype)
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        values = rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
        edges = np.array([info.min, info.max, 0, 1, info.max // 2 + 1], dtype=dtype)
    elif not extremes:
        return rng.normal(0, 100, size=shape).astype(dtype)
    else:
        finfo = np.finfo(dtype)
        bits = np.dtype(f"u{dtype.itemsize}")
        values = rng.integers(0, np.iinfo(bits).max, size=shape, dtype=bits,
                              endpoint=True).view(dtype)
        values = np.where(np.isfinite(values), values, dtype.type(1.5))
        tiny, sub = finfo.tiny, finfo.smallest_subnormal
        edges = np.array([finfo.min, finfo.max, tiny, -tiny, sub, -sub, tiny - sub, -0.0, 0.0,
                          finfo.eps, 1 + finfo.eps, -1.0], dtype=dtype)
    if extremes:
        flat = values.reshape(-1)
        flat[:len(edges)] = edges[:len(flat)]
    return values


@st.composite
def datasets(draw: st.DrawFn) -> tuple[list[np.ndarray], wk.WindowSpec, int]:
    """A random store to convert: series of one dtype and step shape, a window
    spec and ``block_rows``."""
    dtype = draw(st.sampled_from(DTYPES))
    step = draw(STEP_SHAPES)
    spec = wk.WindowSpec(length=draw(st.integers(1, 6)), stride=draw(st.integers(1, 3)),
                         sampling_rate=draw(st.integers(1, 3)), horizon=draw(st.integers(0, 3)))
    # at least one series holds a window (else convert refuses: tests/sources/test_bad_input.py)
    lengths = draw(st.lists(st.integers(1, 50), min_size=0, max_size=3))
    lengths.insert(draw(st.integers(0, len(lengths))), draw(st.integers(spec.span, 50)))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    series = [dtype_values(dtype, (n, *step), rng) for n in lengths]
    block_rows = draw(st.integers(1, 24))
    return series, spec, block_rows


def dtype_series(dtype: str) -> list[np.ndarray]:
    """Three series of 60 steps of 2 features of ``dtype``, edge values first."""
    rng = np.random.default_rng(sum(map(ord, dtype)))
    return [dtype_values(np.dtype(dtype), (60, 2), rng, extremes=True) for _ in range(3)]


def normalized(store: wk.Store, x: np.ndarray, y: np.ndarray | None
               ) -> tuple[np.ndarray, np.ndarray | None]:
    """``(x, y)`` normalized by the store's statistics, as NumPy computes it."""
    norm = store.normalizer()
    return norm(x), (norm.select(store.target_positions)(y) if y is not None else None)


def check_normalized(got: tuple[np.ndarray, np.ndarray | None],
                     expected: tuple[np.ndarray, np.ndarray | None], dtype: str) -> None:
    """Normalized windows are float32 (float64 stays float64) and match NumPy's."""
    want = np.dtype(np.float64 if dtype == "float64" else np.float32)
    assert (got[1] is None) == (expected[1] is None)
    for part, expected_part in zip(got, expected, strict=True):
        if expected_part is not None:
            assert part is not None and part.dtype == want
            np.testing.assert_allclose(part, expected_part, rtol=1e-6)


# -- tf.data graphs --------------------------------------------------------------------------
def graph_ops(ds: Any) -> set[str]:
    """Every op type in a ``tf.data.Dataset``'s graph, its functions' included."""
    import tensorflow as tf

    graph = tf.compat.v1.GraphDef()
    graph.ParseFromString(ds._as_serialized_graph().numpy())
    ops = {node.op for node in graph.node}
    for function in graph.library.function:
        ops |= {node.op for node in function.node_def}
    return ops
