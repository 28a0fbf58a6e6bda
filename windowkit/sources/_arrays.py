"""Input series: the readers that turn user sources into :class:`Series`.

A source is a ``.npy`` path (memory-mapped header, rows read block by block,
never the whole file), a glob or list of ``.npy`` paths (one series each), or a
list/dict of arrays. Every series is read in row blocks so that conversion
memory does not grow with the source.
"""

from __future__ import annotations

import glob as globlib
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import numpy as np
import xxhash

from windowkit._schema import MAX_STEP_ITEMS
from windowkit.errors import SourceChangedError, SourceError, SourceNotFoundError, WindowkitError
from windowkit.location import as_url_path, is_url, read_ranges, remote_errors, resolve
from windowkit.sources._datasets import table_files
from windowkit.sources._pins import check_regular, object_changed, remote_version

SourceLike = str | os.PathLike[str] | np.ndarray | Sequence[Any] | Mapping[str, Any]

_GLOB_CHARS = set("*?[")
_DIGEST_BYTES = 16 << 20  # rows hashed at a time
MAX_STEP_DIMS = 8  # dimensions of a row (step) that a store's manifest holds


class Series(Protocol):
    """One time series: ``rows`` steps of shape ``step_shape``."""

    @property
    def key(self) -> str: ...

    @property
    def rows(self) -> int: ...

    @property
    def dtype(self) -> np.dtype: ...

    @property
    def step_shape(self) -> tuple[int, ...]: ...

    @property
    def where(self) -> str:
        """How error messages name this series: a path, or ``series 'k'``."""
        ...

    def read(self, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` as a C-contiguous little-endian array."""
        ...


def _native(dtype: np.dtype) -> np.dtype:
    return dtype.newbyteorder("<") if dtype.byteorder == ">" else dtype


def check_dtype(dtype: np.dtype, where: str) -> np.dtype:
    """Accept the dtypes every format stores exactly: float16/32/64, signed and
    unsigned ints, bool (not float128/longdouble, which no format holds)."""
    if dtype.kind not in "fiub" or dtype.fields is not None or dtype.itemsize > 8:
        raise SourceError(
            f"{where}: dtype {dtype} is not supported; expected a real numeric dtype "
            "(float16/32/64, int8..64, uint8..64 or bool)"
        )
    return _native(dtype)


@dataclass
class NpySeries:
    """A series stored in a ``.npy`` file, read by byte range (no full load)."""

    path: str
    key: str
    rows: int
    dtype: np.dtype
    step_shape: tuple[int, ...]
    data_offset: int
    fortran_order: bool
    file_dtype: np.dtype  # as stored, possibly big-endian

    @property
    def where(self) -> str:
        return self.path

    @classmethod
    def open(cls, path: str) -> NpySeries:
        if check_regular(path) is None:
            raise SourceNotFoundError(f"{path}: no such file")
        if os.path.isdir(path):
            raise SourceError(f"{path}: is a directory, expected a .npy file")
        with open(path, "rb") as fh:
            if fh.read(6) != b"\x93NUMPY":
                raise SourceError(f"{path}: not a .npy file (no NumPy header)")
        try:
            mapped = np.load(path, mmap_mode="r", allow_pickle=False)
        except ValueError as exc:
            message = str(exc)
            if "Python objects" in message:
                raise SourceError(
                    f"{path}: dtype object is not supported; expected a real numeric dtype"
                ) from None
            if "larger than" in message or "greater than" in message or "shape" in message:
                raise SourceError(f"{path}: truncated or damaged .npy file ({message})") from None
            raise SourceError(f"{path}: not a readable .npy file ({message})") from None
        except (OSError, SyntaxError, EOFError) as exc:
            raise SourceError(f"{path}: not a readable .npy file ({exc})") from None
        if not isinstance(mapped, np.memmap):
            raise SourceError(f"{path}: not a .npy array file")
        shape, file_dtype, data_offset = mapped.shape, mapped.dtype, mapped.offset
        fortran_order = bool(mapped.flags.f_contiguous and not mapped.flags.c_contiguous)
        del mapped  # only the header was needed: rows are read by byte range
        dtype = check_dtype(file_dtype, path)
        if len(shape) == 0:
            raise SourceError(f"{path}: holds a scalar, expected an array of rows")
        return cls(
            path=path,
            key=Path(path).stem,
            rows=int(shape[0]),
            dtype=dtype,
            step_shape=tuple(int(d) for d in shape[1:]),
            data_offset=data_offset,
            fortran_order=bool(fortran_order),
            file_dtype=file_dtype,
        )

    def read(self, start: int, stop: int) -> np.ndarray:
        try:
            if self.fortran_order:
                return self._read_fortran(start, stop)
            step_items = int(np.prod(self.step_shape, dtype=np.int64))
            count = (stop - start) * step_items
            offset = self.data_offset + start * step_items * self.file_dtype.itemsize
            block = np.fromfile(self.path, dtype=self.file_dtype, count=count, offset=offset)
        except (ValueError, OSError) as exc:  # truncated or replaced since it was opened
            raise SourceChangedError(f"{self.path}: cannot read rows {start}..{stop}; the file "
                              "changed or was truncated during the conversion "
                              f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
                              ) from None
        if block.size != count:  # it was whole when opened
            raise SourceChangedError(f"{self.path}: file ended early while reading rows "
                                     f"{start}..{stop}; it changed during the conversion")
        return block.reshape((stop - start, *self.step_shape)).astype(self.dtype, copy=False)

    def _read_fortran(self, start: int, stop: int) -> np.ndarray:
        """Rows of a Fortran-ordered file, through a memory map of the whole file."""
        mm = np.load(self.path, mmap_mode="r", allow_pickle=False)
        if mm.shape[1:] != self.step_shape or len(mm) < stop or mm.dtype != self.file_dtype:
            raise ValueError(f"it now holds {mm.shape} {mm.dtype}")
        return np.ascontiguousarray(mm[start:stop], dtype=self.dtype)


@dataclass
class ArraySeries:
    """A series held by the caller as an array (or array-like memmap)."""

    key: str
    array: Any

    def __post_init__(self) -> None:
        where = self.where
        if _is_pandas(self.array):  # a Series (or DataFrame) in a list or dict
            self.array = _pandas_values(self.array, where)
        if not hasattr(self.array, "shape") or not hasattr(self.array, "dtype"):
            try:
                self.array = np.asarray(self.array)
            except (ValueError, TypeError) as exc:
                raise SourceError(f"{where}: cannot be read as an array ({exc})") from None
        if len(self.array.shape) == 0:
            raise SourceError(f"{where}: is a scalar, expected an array of rows")
        self.dtype = check_dtype(np.dtype(self.array.dtype), where)

    @property
    def where(self) -> str:
        return f"series {self.key!r}"

    @property
    def rows(self) -> int:
        return int(self.array.shape[0])

    @property
    def step_shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.array.shape[1:])

    def read(self, start: int, stop: int) -> np.ndarray:
        rows = np.ascontiguousarray(self.array[start:stop], dtype=self.dtype)
        if len(rows) != stop - start:
            raise SourceError(f"{self.where}: returned {len(rows)} rows for rows "
                              f"{start}..{stop} (it says it has {self.rows})")
        return rows

    def content_digest(self) -> str:
        """A digest of every row (read in bounded pieces): what identifies an
        array's content when resuming a conversion."""
        digest = xxhash.xxh3_128()
        row_bytes = max(1, self.dtype.itemsize * int(np.prod(self.step_shape, dtype=np.int64)))
        step = max(1, _DIGEST_BYTES // row_bytes)
        for start in range(0, self.rows, step):
            digest.update(self.read(start, min(self.rows, start + step)).data)
        return digest.hexdigest()


@dataclass
class RemoteNpySeries:
    """A ``.npy`` file on object storage (any fsspec URL), read by byte range:
    one ranged request per block of rows, never the whole file."""

    path: str  # the URL
    key: str
    rows: int
    dtype: np.dtype
    step_shape: tuple[int, ...]
    data_offset: int
    file_dtype: np.dtype
    version: str  # the object's ETag or modification time: what resume compares

    @property
    def where(self) -> str:
        return self.path

    @classmethod
    def open(cls, url: str) -> RemoteNpySeries:
        from numpy.lib import format as npy_format

        path = resolve(url)
        with remote_errors(url, SourceError):
            try:
                info = as_url_path(path).fs.info(as_url_path(path).path)
            except FileNotFoundError:
                raise SourceNotFoundError(f"{url}: no such file") from None
            with path.open("rb") as fh:
                try:
                    version = npy_format.read_magic(fh)
                    header = (npy_format.read_array_header_1_0(fh) if version == (1, 0)
                              else npy_format.read_array_header_2_0(fh))
                except ValueError as exc:
                    raise SourceError(f"{url}: not a .npy file ({exc})") from None
                offset = fh.tell()
        shape, fortran_order, file_dtype = header
        if fortran_order:
            raise SourceError(f"{url}: a Fortran-ordered .npy file cannot be read by row "
                              "ranges from object storage; save it C-ordered")
        if len(shape) == 0:
            raise SourceError(f"{url}: holds a scalar, expected an array of rows")
        return cls(path=url, key=Path(urlsplit(url).path).stem, rows=int(shape[0]),
                   dtype=check_dtype(file_dtype, url),
                   step_shape=tuple(int(d) for d in shape[1:]), data_offset=offset,
                   file_dtype=file_dtype, version=_version(info))

    def read(self, start: int, stop: int) -> np.ndarray:
        step_items = int(np.prod(self.step_shape, dtype=np.int64))
        row_bytes = step_items * self.file_dtype.itemsize
        first = self.data_offset + start * row_bytes
        try:
            data = read_ranges([resolve(self.path)], [first],
                               [first + (stop - start) * row_bytes])[0]
        except (OSError, WindowkitError):  # the object may have been written again
            if remote_version(self.path) != self.version:
                raise object_changed(self.path) from None
            raise
        if len(data) != (stop - start) * row_bytes:
            raise SourceError(f"{self.path}: file ended early while reading rows {start}..{stop}")
        block = np.frombuffer(data, dtype=self.file_dtype).reshape(stop - start,
                                                                   *self.step_shape)
        return block.astype(self.dtype, copy=False)


def _version(info: Mapping[str, Any]) -> str:
    """What identifies an object's content: its ETag (else time, else size)."""
    return str(info.get("ETag") or info.get("mtime") or info.get("size"))


def _expand_path(path: str) -> list[str]:
    if is_url(path):
        if not any(ch in _GLOB_CHARS for ch in path):
            return [path]
        url = as_url_path(resolve(path))
        with remote_errors(path, SourceError):
            matches = sorted(f"{url.protocol}://{name}" for name in url.fs.glob(url.path))
        if not matches:
            raise SourceNotFoundError(f"{path}: no file matches this pattern")
        return matches
    if any(ch in _GLOB_CHARS for ch in path):
        matches = sorted(globlib.glob(path))
        if not matches:
            raise SourceNotFoundError(f"{path}: no file matches this pattern")
        return matches
    return [path]


def _open_path(path: str) -> Series:
    suffix = Path(urlsplit(path).path if is_url(path) else path).suffix.lower()
    if suffix == ".npy":
        return RemoteNpySeries.open(path) if is_url(path) else NpySeries.open(path)
    if is_url(path):
        raise SourceError(f"{path}: unsupported source type {suffix or '(no extension)'!r}; "
                          "expected .npy, .csv or .parquet")
    if not os.path.exists(path):
        raise SourceNotFoundError(f"{path}: no such file")
    raise SourceError(f"{path}: unsupported source type {suffix or '(no extension)'!r}; "
                      "expected .npy files, or CSV or Parquet tables")


def source_files(source: Any) -> list[str]:
    """The files a source reads (paths, globs expanded, memory-mapped arrays'
    files), so that a conversion never writes over its own input."""
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if is_url(path):
            return [path]
        paths = sorted(globlib.glob(path)) if any(c in _GLOB_CHARS for c in path) else [path]
        tables = table_files(paths) if any(os.path.isdir(p) for p in paths) else None
        return list(tables.files) if tables is not None else paths
    if isinstance(source, np.memmap):
        return [str(source.filename)] if source.filename else []
    if isinstance(source, Mapping):
        return [f for value in source.values() for f in source_files(value)]
    if isinstance(source, Sequence) and not isinstance(source, (str, bytes)):
        return [f for item in source for f in source_files(item)]
    return []


def open_sources(source: SourceLike) -> list[Series]:
    """Resolve any supported source into a list of series, checked for consistency."""
    series: list[Series]
    if isinstance(source, (str, os.PathLike)):
        series = [_open_path(p) for p in _expand_path(os.fspath(source))]
    elif isinstance(source, np.ndarray):
        series = [ArraySeries("0", source)]
    elif _is_pandas(source) and type(source).__name__ == "Series":
        series = [ArraySeries(_series_name(source, "0"), source)]
    elif isinstance(source, Mapping):
        series = [ArraySeries(str(k), v) for k, v in source.items()]
    elif isinstance(source, Sequence):
        items = list(source)
        if items and all(isinstance(s, (str, os.PathLike)) for s in items):
            paths = [p for s in items for p in _expand_path(os.fspath(s))]
            series = [_open_path(p) for p in paths]
        else:
            series = [ArraySeries(k, a) for k, a in zip(_list_keys(items), items, strict=True)]
    else:
        raise SourceError(
            f"unsupported source of type {type(source).__name__}; expected a .npy path, "
            "a glob or list of paths, an array, a pandas Series or DataFrame, a CSV or "
            "Parquet table, or a list/dict of arrays"
        )
    return check_consistent(series)


def _is_pandas(value: Any) -> bool:
    return type(value).__module__.split(".")[0] == "pandas" and hasattr(value, "to_numpy")


def _series_name(value: Any, default: str) -> str:
    """A pandas Series' key: its name, else ``default``."""
    name = getattr(value, "name", None)
    return default if name is None else str(name)


def _list_keys(items: list[Any]) -> list[str]:
    """The keys of a list of series: their names when every one is a named
    pandas Series (names unique), else their positions."""
    names = [_series_name(a, "") if _is_pandas(a) and type(a).__name__ == "Series" else ""
             for a in items]
    if all(names) and len(set(names)) == len(names):
        return names
    return [str(i) for i in range(len(items))]


def _pandas_values(value: Any, where: str) -> np.ndarray:
    """A pandas Series' (or DataFrame's) values as an array: scalar steps, or
    the steps its cells hold (arrays of one shape); nullable columns as floats
    with NaN for the missing values."""
    values = value.to_numpy()
    if values.dtype != object:
        return np.asarray(values)
    try:
        return np.asarray(value.to_numpy(dtype=np.float64, na_value=np.nan))
    except (TypeError, ValueError):
        pass
    try:
        return np.stack([np.asarray(v) for v in values]) if len(values) else values
    except (TypeError, ValueError) as exc:
        raise SourceError(f"{where}: its values are neither numbers nor arrays of one shape "
                          f"({str(exc).splitlines()[0]})") from None


def check_consistent(series: Iterable[Series]) -> list[Series]:
    """The series, checked: unique keys, not empty, one dtype and step shape."""
    series = list(series)
    if not series:
        raise SourceError("the source holds no series")
    first = series[0]
    _check_step_shape(first)
    keys: set[str] = set()
    for s in series:
        if s.key in keys:
            raise SourceError(f"{s.where}: series key {s.key!r} appears twice")
        keys.add(s.key)
        if s.rows == 0:
            raise SourceError(f"{s.where}: series is empty (0 rows)")
        if s.dtype != first.dtype:
            raise SourceError(
                f"{s.where}: dtype {s.dtype} differs from {first.where} ({first.dtype}); "
                "every series of a store must share one dtype"
            )
        if s.step_shape != first.step_shape:
            raise SourceError(
                f"{s.where}: step shape {s.step_shape} differs from {first.where} "
                f"({first.step_shape}); every series of a store must share one step shape"
            )
    return series


def _check_step_shape(series: Series) -> None:
    """Refuse rows a store cannot hold: more than 8 dimensions, or no values."""
    shape = series.step_shape
    if len(shape) > MAX_STEP_DIMS:
        raise SourceError(f"{series.where}: rows have {len(shape)} dimensions {shape}; a "
                          f"store holds rows of at most {MAX_STEP_DIMS} dimensions (reshape "
                          "the array)")
    if 0 in shape:
        raise SourceError(f"{series.where}: rows hold no values (step shape {shape}); each "
                          "row needs at least one feature")
    items = int(np.prod(shape, dtype=np.int64))
    if items > MAX_STEP_ITEMS:
        raise SourceError(f"{series.where}: rows hold {items} values each; a store holds "
                          f"at most {MAX_STEP_ITEMS} per row")


def check_finite(block: np.ndarray, series: Series, first_row: int) -> None:
    """Raise naming series, row and column if ``block`` holds NaN or infinity."""
    if block.dtype.kind != "f":
        return
    finite = np.isfinite(block)
    if finite.all():
        return
    bad = np.argwhere(~finite)[0]
    row = first_row + int(bad[0])
    features = getattr(series, "features", ())
    if features and len(bad) == 2:
        column = repr(features[int(bad[1])])
    else:
        column = ", ".join(str(int(i)) for i in bad[1:]) or "0"
    value = block[tuple(bad)]
    raise SourceError(
        f"{series.where}: row {row}, column {column} is {value}; missing or infinite "
        "values are not allowed (--nan skip keeps the rows and leaves out the windows "
        "touching them)"
    )
