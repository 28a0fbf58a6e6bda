"""Zarr v3 storage: one array of all rows, chunked along rows, zstd + crc32c.

The array carries Zarr v3 ``dimension_names`` (:func:`dimension_names`), so
xarray and xbatcher label its axes: ``"row"`` first, then ``"feature"`` for
vector steps, or ``"step_dim_0"``, ``"step_dim_1"``, ... for N-D steps (such as
``[C, H, W]`` frames, whose axes windowkit does not name). Readers never check
the names: an array written without them (by an earlier release) reads the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import google_crc32c
import numpy as np
from pydantic import ValidationInfo, model_validator

from windowkit._schema import Positive, context_value
from windowkit.errors import StoreError
from windowkit.formats._checks import (
    BlockDigester,
    CheckedReader,
    ask_guard,
    checked,
    in_threads,
    read_file,
    read_local,
    write_digests,
)
from windowkit.formats.base import (
    STORE_ID_KEY,
    DataLayout,
    DataSection,
    PartTask,
    Piece,
    ReaderSetup,
    ReadSeries,
    RowReader,
)
from windowkit.location import is_remote, list_objects, read_ranges
from windowkit.spec import WindowSpec

COMPRESSIONS = ("zstd", "gzip", "none")
_CHUNK_OVERHEAD = 64  # bytes a chunk file may add to its rows (checksum, frame headers)
_CRC32C_RESIDUE = 0x48674BC7  # CRC-32C of any bytes followed by their CRC-32C (little-endian)

_WRITE_BYTES = 16 << 20  # rows buffered before one multi-chunk write
MAX_METADATA_BYTES = 16 << 20  # the most a zarr.json may hold (a few hundred bytes written)


def dimension_names(step_shape: tuple[int, ...]) -> tuple[str, ...]:
    """The array's Zarr ``dimension_names``: ``("row",)`` for scalar steps,
    ``("row", "feature")`` for vector steps, ``("row", "step_dim_0", ...)``
    for N-D steps."""
    if len(step_shape) == 1:
        return ("row", "feature")
    return ("row", *(f"step_dim_{i}" for i in range(len(step_shape))))


def _compressors(compression: str) -> list[Any]:
    from zarr.codecs import Crc32cCodec, GzipCodec, ZstdCodec

    codecs: dict[str, list[Any]] = {
        "zstd": [ZstdCodec(level=3)], "gzip": [GzipCodec(level=5)], "none": []}
    return [*codecs[compression], Crc32cCodec()]  # names checked by convert


class _SlabWriter:
    """Buffers consecutive rows and writes them to the array in chunk-aligned slabs."""

    def __init__(self, array: Any, layout: DataLayout, first_row: int) -> None:
        chunks_per_write = max(1, _WRITE_BYTES // (layout.rows.row_bytes * layout.rows.block_rows))
        self._array = array
        self._slab = np.empty(
            (chunks_per_write * layout.rows.block_rows, *layout.rows.step_shape),
            dtype=layout.rows.dtype)
        self._slab_start = first_row  # global row of slab[0]
        self._filled = 0

    def write(self, global_start: int, rows: np.ndarray) -> None:
        if global_start != self._slab_start + self._filled:
            raise StoreError(f"rows from {global_start} do not follow the rows written before")
        while len(rows):
            take = min(len(rows), len(self._slab) - self._filled)
            self._slab[self._filled:self._filled + take] = rows[:take]
            self._filled += take
            rows = rows[take:]
            if self._filled == len(self._slab):
                self.flush()

    def flush(self) -> int:
        """Write what is buffered; return the global row after the last one written."""
        if self._filled:
            stop = self._slab_start + self._filled
            self._array[self._slab_start:stop] = self._slab[: self._filled]
            self._slab_start, self._filled = stop, 0
        return self._slab_start


async def _cancel_other_tasks() -> None:
    current = asyncio.current_task()
    tasks = [task for task in asyncio.all_tasks() if task is not current]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _settle_pending_writes() -> None:
    """Cancel and await what is left on zarr's event loop after a failed write."""
    from zarr.core import sync

    loop = sync.loop[0]
    if loop is not None and loop.is_running():
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(_cancel_other_tasks(), loop).result(timeout=30)


class ZarrData(DataSection):
    """The manifest's ``data`` section of a Zarr store."""

    array: Literal["."]
    chunk_rows: Positive

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> ZarrData:
        self.check_compression(COMPRESSIONS)
        if self.chunk_rows != context_value(info, "block_rows"):
            raise ValueError(f"chunk_rows {self.chunk_rows} differs from block_rows")
        if "data/zarr.json" not in (context_value(info, "files") or set()):
            raise ValueError("files does not list data/zarr.json")
        return self


def open_array(data_dir: Path) -> Any:
    """The Zarr array in ``data_dir``, read-only, from its ``zarr.json`` alone,
    which windowkit reads itself (:func:`read_file`: a local file must be a
    regular file and is opened without blocking, an object is fetched within
    the URL's timeouts); zarr reads nothing, and windowkit reads the chunks."""
    import zarr
    from zarr.core.buffer import default_buffer_prototype

    blob = read_file(data_dir / "zarr.json", MAX_METADATA_BYTES)
    held = {"zarr.json": default_buffer_prototype().buffer.from_bytes(blob)}
    return zarr.open_array(store=zarr.storage.MemoryStore(held, read_only=True), mode="r")


class ZarrRowReader(RowReader):
    """Reads global row ranges chunk by chunk: each chunk file is read (locally
    without following a link), its CRC-32C checked and its rows decoded into at
    most one chunk's bytes (a decompression bomb is one line); a missing chunk
    file is an error, never fill values."""

    def __init__(self, data_dir: Path, setup: ReaderSetup, compression: str) -> None:
        self._data_dir = data_dir
        self._setup = setup
        self._compression = compression
        self.block_rows = setup.rows.block_rows
        self._chunk_bytes = setup.rows.block_rows * max(1, setup.rows.dtype.itemsize * int(
            np.prod(setup.rows.step_shape, dtype=np.int64)))
        self._little = setup.rows.dtype.newbyteorder("<")
        # chunks decode straight into the result when its rows are stored as they are
        self._in_place = self._little == setup.rows.dtype
        self._stored_limit = self._chunk_bytes + self._chunk_bytes // 100 + 1024
        self._rest = "/0" * len(setup.rows.step_shape)  # the chunk key after the row chunk
        self._files = f"{data_dir}/c/"  # a local chunk file: _files + f"{chunk}{_rest}"
        self._opened = False
        self._chunk_keys: dict[str, int] | None = None  # on object storage: listed once

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_opened": False, "_chunk_keys": None}

    def _open(self) -> None:
        """Check the array's metadata against the manifest (once)."""
        if self._opened:
            return
        setup, where = self._setup, self._data_dir / "zarr.json"
        try:
            array = open_array(self._data_dir)
            found = (tuple(array.shape), tuple(array.chunks), np.dtype(array.dtype),
                     array.attrs.get(STORE_ID_KEY))
            codecs = _codec_names(array.metadata)
            key = array.metadata.encode_chunk_key((1,) + (0,) * (array.ndim - 1))
        except StoreError:  # one line already: missing, a link, a FIFO, no answer
            ask_guard(setup)  # a replaced store says so (not asked of a silent server)
            raise
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            ask_guard(setup)  # a replaced store says so, never "corrupt"
            raise StoreError(f"{where}: cannot open the Zarr array ({exc})") from exc
        ask_guard(setup)  # after the read: the metadata read was this store's
        rows = setup.rows
        expected = ((rows.total_rows, *rows.step_shape), (rows.block_rows, *rows.step_shape),
                    rows.dtype, setup.store_id)
        if found != expected:
            raise StoreError(f"{where}: the array (shape, chunks, dtype, store id) "
                             f"{found} differs from the manifest's {expected}")
        want = _expected_codecs(self._compression, setup.rows.dtype)
        if codecs != want or key != f"c/1{self._rest}":
            raise StoreError(f"{where}: the array's codecs {codecs} (chunk key {key!r}) "
                             f"differ from what the manifest says: {want} (key "
                             f"'c/1{self._rest}')")
        self._opened = True

    def _chunk_path(self, chunk: int) -> Path:
        return self._data_dir / f"c/{chunk}{self._rest}"

    def _fetched(self, chunks: range) -> list[bytes]:
        """The stored bytes of ``chunks`` on object storage, read together."""
        paths = [self._chunk_path(c) for c in chunks]
        if self._chunk_keys is None:  # one listing, not a request per chunk
            self._chunk_keys = list_objects(self._data_dir)
        sizes = [self._chunk_keys.get(f"c/{c}{self._rest}") for c in chunks]
        for path, size in zip(paths, sizes, strict=True):
            if size is None:
                raise StoreError(f"{path}: Zarr chunk file is missing")
            if size > self._stored_limit:
                raise StoreError(f"{path}: holds {size} bytes, more than a chunk can")
        try:
            return read_ranges(paths, [0] * len(paths), [int(s or 0) for s in sizes])
        except StoreError:
            raise  # one line already (a server that did not answer)
        except OSError as exc:
            raise StoreError(f"{paths[0]}: cannot read ({exc})") from exc

    def _decode(self, chunk: int, stored: bytes, into: np.ndarray) -> None:
        """Chunk ``chunk``'s rows from its stored bytes into ``into`` (a
        C-contiguous array of one chunk's little-endian rows): CRC checked,
        decoded into at most one chunk's bytes. The decoder writes ``into``
        itself, outside the interpreter lock (zstd, zlib)."""
        # the CRC-32C of the payload followed by its own CRC is a constant: the
        # check needs no copy of the payload (and leaves the lock from 1 MiB)
        if len(stored) < 4 or google_crc32c.value(stored) != _CRC32C_RESIDUE:
            found, kept = google_crc32c.value(stored[:-4]), int.from_bytes(stored[-4:], "little")
            ask_guard(self._setup)  # a replaced store says so, never "corrupt"
            raise StoreError(f"{self._chunk_path(chunk)}: Zarr chunk fails its CRC-32C check"
                             ) from ValueError(f"CRC-32C of {len(stored) - 4} bytes is "
                                               f"{found:#010x}, the chunk says {kept:#010x}")
        try:
            decompress_into(memoryview(stored)[:-4], self._compression, into)
        except ValueError as exc:
            ask_guard(self._setup)
            raise StoreError(f"{self._chunk_path(chunk)}: cannot decode Zarr chunk ({exc})"
                             ) from exc

    def _chunk_into(self, out: np.ndarray, start: int, chunk: int,
                    stored: bytes | None) -> None:
        """Chunk ``chunk``'s rows that ``out`` (global rows from ``start``) holds:
        a whole chunk decoded in place, else through a chunk of its own."""
        size = self.block_rows
        lo, hi = max(start, chunk * size), min(start + len(out), (chunk + 1) * size)
        if stored is None:
            stored = _read_chunk(f"{self._files}{chunk}{self._rest}", self._stored_limit)
        if self._in_place and hi - lo == size:
            self._decode(chunk, stored, out[lo - start:hi - start])
            return
        rows = np.empty((size, *self._setup.rows.step_shape), dtype=self._little)
        self._decode(chunk, stored, rows)
        out[lo - start:hi - start] = rows[lo - chunk * size:hi - chunk * size]

    def read_rows(self, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)``: each chunk read, checked and decoded into the
        result where it belongs, several chunks at once over the usable cores
        (the reads and the decoding leave the interpreter lock)."""
        self._open()
        size = self.block_rows
        chunks = range(start // size, -(-stop // size))
        layout = self._setup.rows
        out = np.empty((max(0, stop - start), *layout.step_shape), dtype=layout.dtype)
        stored: list[bytes] | None = None
        if is_remote(self._data_dir):
            try:
                stored = self._fetched(chunks)
            except StoreError:
                ask_guard(self._setup)  # a replaced store says so, never "missing"
                raise
            self._setup.check_store()  # after the read: the chunks read were this store's
        try:
            in_threads(lambda i: self._chunk_into(out, start, chunks[i],
                                                  None if stored is None else stored[i]),
                       len(chunks))
        except StoreError:
            ask_guard(self._setup)  # a replaced store says so, never "missing" or "corrupt"
            raise
        if stored is None:
            self._setup.check_store()  # after the reads: the chunks read were this store's
        return out

    def describe(self, block: int) -> str:
        """Where block ``block`` lies, for messages."""
        return f"{self._chunk_path(block)} (Zarr chunk {block})"


def _codec_names(metadata: Any) -> list[str]:
    """The array's codecs as ``name`` (``bytes:<endian>`` for the bytes codec)."""
    names = []
    for codec in metadata.codecs:
        name = type(codec).__name__.removesuffix("Codec").lower()
        if name == "bytes":
            endian = getattr(codec, "endian", None)
            name += f":{getattr(endian, 'value', endian)}"
        names.append(name)
    return names


def _expected_codecs(compression: str, dtype: np.dtype) -> list[str]:
    endian = "little" if dtype.itemsize > 1 else None
    return [f"bytes:{endian}", *([] if compression == "none" else [compression]), "crc32c"]


def _read_chunk(path: str, limit: int) -> bytes:
    try:
        return read_local(path, limit)
    except StoreError as exc:
        if not os.path.lexists(path):
            raise StoreError(f"{path}: Zarr chunk file is missing") from exc
        raise


def _zstd_content_size(frame: bytes | memoryview) -> int | None:
    """The decoded size a zstd frame's header declares (None: not declared)."""
    if len(frame) < 6 or frame[:4] != b"\x28\xb5\x2f\xfd":
        raise ValueError("not a zstd frame")
    descriptor = frame[4]
    flag, single = descriptor >> 6, (descriptor >> 5) & 1
    size = {0: single, 1: 2, 2: 4, 3: 8}[flag]
    if size == 0:
        return None
    at = 5 + (0 if single else 1) + {0: 0, 1: 1, 2: 2, 3: 4}[descriptor & 3]
    value = int.from_bytes(frame[at:at + size], "little")
    return value + 256 if size == 2 else value


@functools.cache
def _zstd() -> Any:
    """numcodecs' zstd (imported once: a chunk is decoded per call)."""
    from numcodecs import zstd

    return zstd


def decompress_into(payload: bytes | memoryview, compression: str, into: np.ndarray) -> None:
    """``payload`` decoded into ``into`` (C-contiguous), which it must fill
    exactly, never writing more (else ValueError): zstd straight into it (its
    frame must declare that size), outside the interpreter lock."""
    size = into.nbytes
    target = into.reshape(-1).view(np.uint8)
    if compression == "zstd":
        declared = _zstd_content_size(payload)
        if declared != size:
            raise ValueError(f"the zstd frame declares {declared} bytes, a chunk holds {size}")
        try:
            _zstd().decompress(payload, target)
        except RuntimeError as exc:  # a damaged frame, or one decoding to another size
            raise ValueError(str(exc)) from None
        return
    if compression == "none":
        raw = payload
    else:
        inflate = zlib.decompressobj(47)  # gzip or zlib header
        raw = inflate.decompress(payload, size + 1)
        if len(raw) > size or inflate.unconsumed_tail or not inflate.eof:
            raise ValueError(f"the gzip stream does not hold exactly {size} bytes")
    if len(raw) != size:
        raise ValueError(f"decoded to {len(raw)} bytes, a chunk holds {size}")
    target[:] = np.frombuffer(raw, dtype=np.uint8)


class ZarrFormat:
    name: str = "zarr"
    compressions: tuple[str, ...] = COMPRESSIONS
    default_compression: str = "zstd"
    target_block_bytes: int = 1 << 20
    data_model: type[DataSection] = ZarrData

    def min_block_rows(self, spec: WindowSpec) -> int:
        return spec.span

    def max_data_bytes(self, layout: DataLayout, num_pieces: int) -> int:
        return int(layout.rows.total_rows * layout.rows.row_bytes * 1.01) + (
            layout.rows.num_blocks * _CHUNK_OVERHEAD) + (64 << 10)

    def prepare(self, data_dir: Path, layout: DataLayout, num_parts: int) -> None:
        """Create the array (metadata only); parts then fill disjoint chunks."""
        import zarr

        zarr.create_array(
            store=str(data_dir),
            shape=(layout.rows.total_rows, *layout.rows.step_shape),
            chunks=(layout.rows.block_rows, *layout.rows.step_shape),
            dtype=layout.rows.dtype,
            compressors=_compressors(layout.compression),
            fill_value=0,
            config={"write_empty_chunks": True},
            zarr_format=3,
            dimension_names=dimension_names(layout.rows.step_shape),
            attributes={STORE_ID_KEY: layout.store_id},
        )

    def write_part(self, data_dir: Path, layout: DataLayout, part: PartTask,
                   pieces: Iterator[Piece], read_series: ReadSeries) -> dict[str, Any]:
        import zarr

        # the setting is not stored with the array: a chunk of zeros (the fill
        # value) must still be written, or it would be missing from the store
        array = zarr.open_array(store=str(data_dir), mode="r+").with_config(
            {"write_empty_chunks": True})
        slab = _SlabWriter(array, layout, part.first_row)
        digester = BlockDigester(layout)
        try:
            for piece in digester.wrap(pieces):
                slab.write(piece.global_start, piece.rows)
            end = slab.flush()
        except BaseException:  # e.g. ENOSPC: the chunk writes still pending end here,
            _settle_pending_writes()  # not as "Task was destroyed" noise at exit
            raise
        if end != part.first_row + part.rows:
            raise StoreError(f"part {part.number} wrote rows up to {end}, expected "
                             f"{part.first_row + part.rows}")
        return {"rows": part.rows, **digester.summary()}

    def part_files(self, data_dir: Path, layout: DataLayout, part: PartTask) -> list[str]:
        """The chunk files of the part's blocks (default v3 chunk key encoding)."""
        first = part.first_row // layout.rows.block_rows
        stop = -(-(part.first_row + part.rows) // layout.rows.block_rows)
        rest = "/0" * len(layout.rows.step_shape)
        return [f"c/{chunk}{rest}" for chunk in range(first, stop)]

    def finish(self, data_dir: Path, layout: DataLayout,
               parts: list[dict[str, Any]]) -> dict[str, Any]:
        section = layout.data_section(array=".", chunk_rows=layout.rows.block_rows,
                                      digests=write_digests(data_dir, layout, parts))
        xarray_group(data_dir.parent, layout)
        return section

    def open_reader(self, data_dir: Path, data: dict[str, Any], setup: ReaderSetup
                    ) -> CheckedReader:
        reader = ZarrRowReader(data_dir, setup, data["compression"])
        return checked(reader, data_dir, data, setup, reader.describe)

    block_name: str = "chunk"

    def data_files(self, data: dict[str, Any]) -> int:
        return 0  # one array; its chunk files are blocks

    def stored_rows(self, root: Path, data: dict[str, Any]) -> int:
        return int(open_array(root / "data").shape[0])


def xarray_group(root: Path, layout: DataLayout) -> None:
    """Make the store a Zarr group holding its array ``data`` and, for vector
    steps with named features, their names as the array ``feature`` (the
    coordinate of the array's ``feature`` dimension), its metadata consolidated
    in the group's ``zarr.json``: ``xr.open_zarr(STORE)`` opens the rows as a
    Dataset with named dimensions, without listing the store's other files."""
    import warnings

    import zarr

    names, shape = layout.columns, layout.rows.step_shape
    if len(shape) == 1 and names and len(names) == shape[0]:
        feature = zarr.create_array(store=str(root / "feature"), shape=(len(names),),
                                    dtype=str, zarr_format=3, dimension_names=["feature"],
                                    overwrite=True)  # in the workspace: ours, if resumed
        feature[:] = np.array(names, dtype=str)
    zarr.open_group(store=str(root), mode="a", zarr_format=3)
    with warnings.catch_warnings():  # the store's other files are not Zarr nodes
        warnings.simplefilter("ignore")
        zarr.consolidate_metadata(str(root), zarr_format=3)
