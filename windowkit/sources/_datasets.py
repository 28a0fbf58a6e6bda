"""Several table files read as one table: CSV or Parquet files (listed, or a
glob), or a directory of Parquet (or CSV) parts, possibly hive-partitioned
(``sensor=a/part-0.parquet``: the partition keys become columns).

They are opened with :mod:`pyarrow.dataset` and streamed file by file, in
order (paths sorted naturally, ``part-2`` before ``part-10``), record batch by
record batch: the rows of the files are one table, with the same series and
time handling as one file, and never loaded whole. The files' columns are
unified (an integer column in one file and a float column in another is
float); a file lacking a column has it empty there.
"""

from __future__ import annotations

import glob as globlib
import hashlib
import io
import os
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from csv import Error as CsvError
from csv import reader as csv_records
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.dataset as ds

from windowkit.errors import SourceError, SourceNotFoundError
from windowkit.location import is_url, resolve

TABLE_SUFFIXES = (".csv", ".parquet", ".pq")
#: compressed CSV files (``data.csv.gz``) are read through their codec, as pandas reads them
CSV_CODECS = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd"}
_GLOB_CHARS = set("*?[")
_IGNORED = (".", "_")  # hidden files, _SUCCESS, _metadata: never parts
BATCH_ROWS = 1 << 16
CSV_BLOCK_BYTES = 8 << 20


@dataclass(frozen=True)
class TableFiles:
    """Table files read in order as one table; ``base_dir``: the directory
    whose hive-style partition folders (``key=value``) become columns."""

    name: str  # how messages name the whole: the directory, pattern or files
    files: tuple[str, ...]
    base_dir: str | None = None

    @property
    def key(self) -> str:
        """The series' key of a wide table (no series column)."""
        return Path(self.base_dir).name if self.base_dir else table_stem(self.files[0])

    @property
    def csv(self) -> bool:
        return table_suffix(self.files[0]) == ".csv"


def _file_name(path: str) -> Path:
    """A file's name, lower case (of a URL's path for a URL)."""
    return Path(Path(urlsplit(path).path if is_url(path) else path).name.lower())


def csv_codec(path: str) -> str | None:
    """The codec of a compressed CSV file (``gzip`` for ``data.csv.gz``), else None."""
    name = _file_name(path)
    return CSV_CODECS.get(name.suffix) if Path(name.stem).suffix == ".csv" else None


def table_suffix(path: str) -> str:
    """A table file's suffix, lower case (of a URL's path for a URL): ``.csv``
    for a compressed CSV file too (``data.csv.gz``)."""
    return ".csv" if csv_codec(path) else _file_name(path).suffix


def table_stem(path: str) -> str:
    """A table file's name without its suffixes (``data`` for ``data.csv.gz``)."""
    stem = Path(path).stem
    return Path(stem).stem if csv_codec(path) else stem


def csv_bytes(fh: Any, path: str) -> Any:
    """``fh``, the file ``path`` opened for reading bytes, decompressed when
    ``path`` is a compressed CSV file (streamed: never read whole)."""
    codec = csv_codec(path)
    return fh if codec is None else pa.CompressedInputStream(fh, codec)


def first_line(fh: Any, path: str) -> bytes:
    """The first line of the CSV file ``path``, opened as ``fh`` (decompressed)."""
    stream = csv_bytes(fh, path)
    lines = stream if stream is fh else io.BufferedReader(stream)
    return bytes(lines.readline(CSV_BLOCK_BYTES))


def csv_sample(fh: Any, path: str, size: int) -> tuple[bytes, int]:
    """The first block of the CSV file ``path`` of ``size`` bytes, opened as
    ``fh``, and about how many bytes of text it holds (a compressed file's:
    its size scaled by the block's compression)."""
    if csv_codec(path) is None:
        return fh.read(CSV_BLOCK_BYTES), size
    stream = csv_bytes(fh, path)  # it closes fh when it goes: fh.tell() while it lives
    sample = bytes(stream.read(CSV_BLOCK_BYTES))
    if len(sample) < CSV_BLOCK_BYTES:
        return sample, len(sample)  # the whole text
    return sample, int(size * len(sample) / max(1, fh.tell()))


def _natural(path: str) -> list[Any]:
    """Sort key: digits compare as numbers (``part-2`` before ``part-10``)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path)]


def _directory_files(directory: str) -> list[str]:
    """The table files under ``directory`` (recursively), hidden ones left out."""
    found = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if not d.startswith(_IGNORED)]
        found += [os.path.join(root, f) for f in files if not f.startswith(_IGNORED)]
    tables = [f for f in found if table_suffix(f) in TABLE_SUFFIXES]
    if not tables:
        raise SourceError(f"{directory}: is a directory without CSV or Parquet files; give "
                          ".npy files, or a directory of table parts")
    others = sorted(set(found) - set(tables))
    if others:
        raise SourceError(f"{others[0]}: not a table part (.csv, .parquet) in the directory "
                          f"{directory}; a directory source holds table parts only")
    return sorted(tables, key=_natural)


def _expand(path: str) -> list[str]:
    """A local path's files: a glob's matches (sorted), or the path itself."""
    if not any(ch in _GLOB_CHARS for ch in path):
        return [path]
    matches = sorted(globlib.glob(path), key=_natural)
    if not matches:
        raise SourceNotFoundError(f"{path}: no file matches this pattern")
    return matches


def _paths(source: Any) -> list[str] | None:
    """The local paths a path, glob or list of them names (None: not paths)."""
    if isinstance(source, (str, os.PathLike)):
        items = [os.fspath(source)]
    elif isinstance(source, Sequence) and not isinstance(source, (str, bytes)) and source \
            and all(isinstance(s, (str, os.PathLike)) for s in source):
        items = [os.fspath(s) for s in source]
    else:
        return None
    if any(is_url(p) for p in items):
        return None
    return [f for item in items for f in _expand(item)]


def table_files(source: Any) -> TableFiles | None:
    """The table files ``source`` names when it names several (a list, a glob,
    a directory of parts), else None (one file, arrays, ``.npy`` files). Tables
    and ``.npy`` files, or CSV and Parquet files, mixed are an error."""
    paths = _paths(source)
    if paths is None or (isinstance(source, (str, os.PathLike)) and paths == [
            os.fspath(source)] and not os.path.isdir(paths[0])):
        return None  # not paths, or one plain file: read as it always was
    directories = [p for p in paths if os.path.isdir(p)]
    if directories and len(paths) > 1:
        raise SourceError(f"{directories[0]}: a directory of table parts is a source on its "
                          "own; give one directory, or the files")
    if directories:
        files = _directory_files(directories[0])
        return TableFiles(directories[0], tuple(files), base_dir=directories[0])
    tables = [p for p in paths if table_suffix(p) in TABLE_SUFFIXES]
    if not tables:
        return None
    if len(tables) != len(paths):
        other = next(p for p in paths if table_suffix(p) not in TABLE_SUFFIXES)
        raise SourceError(f"{other}: a conversion takes .npy files or tables (CSV, Parquet), "
                          f"not both ({tables[0]} is a table); convert them separately")
    kinds = {table_suffix(p) == ".csv" for p in tables}
    if len(kinds) > 1:
        csv = next(p for p in tables if table_suffix(p) == ".csv")
        raise SourceError(f"{csv}: CSV and Parquet files cannot be mixed in one "
                          "conversion; convert them to one kind first")
    if len(set(tables)) != len(tables):
        counts = Counter(tables)
        twice = next(p for p in tables if counts[p] > 1)
        raise SourceError(f"{twice}: is given twice; name each file once")
    name = os.fspath(source) if isinstance(source, (str, os.PathLike)) else \
        f"{tables[0]} .. {tables[-1]}" if len(tables) > 1 else tables[0]
    return TableFiles(name, tuple(tables))


def open_dataset(tables: TableFiles, header: bool = True, text: tuple[str, ...] = ()
                 ) -> ds.Dataset:
    """The files as one :mod:`pyarrow.dataset`, their columns unified, in order
    (CSV files without ``header``: columns ``"0"``, ``"1"``, ... by the first line;
    the CSV columns ``text`` kept as the text they are, not parsed)."""
    from pyarrow import csv

    names = None
    if tables.csv and not header:
        with open(tables.files[0], "rb") as fh:
            names = headless_names(first_line(fh, tables.files[0]))
    fmt: Any = ds.CsvFileFormat(read_options=csv.ReadOptions(
        block_size=CSV_BLOCK_BYTES, column_names=names), convert_options=csv_text(text)) \
        if tables.csv else ds.ParquetFileFormat()
    partitioning = "hive" if tables.base_dir else None
    try:
        first = ds.dataset(list(tables.files), format=fmt, partitioning=partitioning,
                           partition_base_dir=tables.base_dir)
        schemas = [fragment.physical_schema for fragment in first.get_fragments()]
        in_files = set(schemas[0].names)
        parts = [f for f in first.schema if f.name not in in_files] \
            if tables.base_dir else []
        schema = pa.unify_schemas([*schemas, pa.schema(parts)], promote_options="permissive")
        return ds.dataset(list(tables.files), schema=schema, format=fmt,
                          partitioning=partitioning, partition_base_dir=tables.base_dir)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as exc:
        message = str(exc).splitlines()[0]
        raise SourceError(f"{tables.name}: the files cannot be read as one table "
                          f"({message})") from None


def dataset_batches(tables: TableFiles, needed: list[str] | None,
                    parts: list[tuple[int, str]], header: bool = True,
                    text: tuple[str, ...] = ()) -> Iterator[pa.RecordBatch]:
    """The files' record batches, file after file; ``parts`` gets each file's
    first row (in the whole table) and path as it is reached (CSV columns
    ``text`` as text)."""
    dataset = open_dataset(tables, header, text)
    present = set(dataset.schema.names)
    columns = [c for c in needed if c in present] if needed else None
    rows = 0
    for fragment in dataset.get_fragments():
        parts.append((rows, fragment.path))
        try:
            for batch in fragment.to_batches(schema=dataset.schema, columns=columns,
                                             batch_size=BATCH_ROWS):
                rows += batch.num_rows
                yield batch
        except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as exc:
            message = str(exc).splitlines()[0]
            raise SourceError(f"{fragment.path}: cannot read the table ({message})") from None


def csv_text(columns: tuple[str, ...]) -> Any:
    """pyarrow's CSV options keeping ``columns`` as the text they are (a time
    column with ``--time-format``: parsed by it, not guessed)."""
    from pyarrow import csv

    return csv.ConvertOptions(column_types={name: pa.string() for name in columns})


def fingerprint(tables: TableFiles) -> str:
    """What identifies the files' content for resuming: each one's path, size and time."""
    digest = hashlib.blake2b(digest_size=16)
    for path in tables.files:
        stat = os.stat(path)
        digest.update(f"{os.path.abspath(path)}:{stat.st_size}:{stat.st_mtime_ns}\0".encode())
    return f"{tables.name}:{digest.hexdigest()}"


def table_rows(tables: TableFiles) -> tuple[int, int]:
    """About how many rows and columns the files hold (CSV: from their sizes)."""
    dataset = open_dataset(tables)
    columns = len(dataset.schema)
    if not tables.csv:
        return sum(f.metadata.num_rows for f in dataset.get_fragments()), columns
    first = os.path.getsize(tables.files[0])
    with open(tables.files[0], "rb") as fh:
        sample, text = csv_sample(fh, tables.files[0], first)
    size = sum(os.path.getsize(f) for f in tables.files) * text // max(1, first)
    rows, _ = csv_shape(sample, size)
    return rows, columns


def first_fields(line: bytes) -> list[str]:
    """The fields of a CSV file's first line, as Python's csv module splits them."""
    try:
        return next(csv_records(io.StringIO(line.decode("utf-8", errors="replace"))), [])
    except CsvError:  # a field over the csv module's limit
        return line.decode("utf-8", errors="replace").split(",")


def headless_names(line: bytes) -> list[str] | None:
    """Column names for a CSV file without a header whose first line is ``line``:
    ``"0"``, ``"1"``, ... as pandas' ``header=None`` (None for an empty file)."""
    return [str(i) for i in range(len(first_fields(line)))] or None


def csv_file(source: Any) -> str | None:
    """The CSV file a table source is (the first of several), else None."""
    tables = table_files(source)
    if tables is not None:
        return tables.files[0] if tables.csv else None
    if not isinstance(source, (str, os.PathLike)):
        return None
    path = os.fspath(source)
    return path if table_suffix(path) == ".csv" else None


def numeric_header(source: Any) -> tuple[str, list[str]] | None:
    """The CSV file (the first of several) and its header's names, when they are
    all numbers (:func:`looks_like_data`); None otherwise, or when unreadable
    (staging says why)."""
    path = csv_file(source)
    if path is None:
        return None
    try:
        location = resolve(path)
        if not is_url(path) and not os.path.isfile(path):
            return None  # a FIFO or a device is never opened
        with location.open("rb") as fh:
            names = first_fields(first_line(fh, path))
    except Exception:  # unreadable or unreachable: staging says why
        return None
    return (path, names) if looks_like_data(names) else None


def looks_like_data(names: Sequence[str]) -> bool:
    """Whether a header's names are all numbers: the file's first row, not a header."""
    def number(name: str) -> bool:
        try:
            float(name)
        except ValueError:
            return False
        return bool(name.strip())

    return bool(names) and all(number(n) for n in names)


def csv_shape(sample: bytes, size: int) -> tuple[int, int]:
    """About the rows of CSV text of ``size`` bytes and its header's columns,
    from ``sample``, its first block: line ends counted, the header split by
    Python's csv module. Parsing the block with pyarrow instead infers every
    column's type (seconds for 200,000 columns), which staging does anyway."""
    if not sample:
        raise ValueError("an empty CSV file")  # staging says so
    try:
        header = next(csv_records(io.StringIO(sample.decode("utf-8", errors="replace"))), [])
        columns = len(header)
    except CsvError:  # a field over the csv module's limit: count the separators
        columns = sample.split(b"\n", 1)[0].count(b",") + 1
    lines = sample.count(b"\n") or sample.count(b"\r")
    return int(size / len(sample) * max(1, lines)) + 1, columns
