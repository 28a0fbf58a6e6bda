"""The interface every storage format implements.

A format owns everything about its own section of a store (``data/``): how rows are
written and read, its typed section of the manifest, how its files are
verified and described, and how ``tf.data`` reads its blocks. The conversion
pipeline owns series, windows, the index and the rest of the manifest. Global
row numbers are the concatenation of all series.
The pipeline cuts the rows into *parts* (runs of whole storage blocks; a
TFRecord or Parquet part is one data file, ``data/part-NNNNN...``) that are
written independently, possibly in parallel processes; each part is handed to
the format as *pieces*: the rows of one series inside one storage block.
"""

from __future__ import annotations

import abc
import pickle
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Protocol, Self, runtime_checkable

import numpy as np
from pydantic import ValidationInfo, model_validator

from windowkit._schema import Count, StorePath, Strict, context_value
from windowkit.layout import RowLayout
from windowkit.spec import WindowSpec


@dataclass(frozen=True)
class DataLayout:
    """What a writer needs to lay rows out, fixed before the first row."""

    rows: RowLayout
    window: WindowSpec
    compression: str
    store_id: str = ""  # written into data files where the format allows
    columns: tuple[str, ...] | None = None  # the features' names, where the source has them

    def data_section(self, **fields: Any) -> dict[str, Any]:
        """A format's ``data`` section of the manifest: its ``fields`` and what
        every format records (compression, raw bytes of the rows)."""
        return {"compression": self.compression, "raw_bytes": self.rows.raw_bytes, **fields}


#: Key of the store id in data files' own metadata (Parquet, Zarr attributes).
STORE_ID_KEY = "windowkit_store_id"


def store_tag(store_id: str) -> int:
    """The store id as a non-negative int64 (its first 60 bits), for formats
    whose records hold integers only."""
    return int(store_id[:15], 16) if store_id else 0


class DataSection(Strict):
    """The manifest's ``data`` section: what every format records, plus its own
    fields (a subclass per format). Validated with the manifest as context."""

    compression: str
    raw_bytes: Count
    digests: StorePath  # each block's digests (``windowkit.formats._checks``)

    @model_validator(mode="after")
    def _raw_bytes_match(self, info: ValidationInfo) -> DataSection:
        rows, row_bytes = context_value(info, "total_rows"), context_value(info, "row_bytes")
        if rows is not None and row_bytes is not None and self.raw_bytes != rows * row_bytes:
            raise ValueError(f"raw_bytes {self.raw_bytes} is not total_rows ({rows}) times "
                             f"the row's {row_bytes} bytes")
        if self.digests not in (context_value(info, "files") or set()):
            raise ValueError(f"block digests {self.digests!r} are not in files")
        return self

    def check_compression(self, allowed: Sequence[str]) -> None:
        if self.compression not in allowed:
            raise ValueError(f"compression {self.compression!r} is not one of "
                             f"{', '.join(allowed)}")


class DataFile(Strict):
    """A data file holding the global rows ``[first_row, first_row + rows)``."""

    path: StorePath
    first_row: Count
    rows: Count


def check_data_files(files: Sequence[DataFile], info: ValidationInfo) -> None:
    """The data files must be listed in the manifest and hold every row once, in order."""
    listed = context_value(info, "files") or set()
    position = 0
    for entry in files:
        if entry.path not in listed:
            raise ValueError(f"data file {entry.path!r} is not in files")
        if entry.first_row != position:
            raise ValueError(f"data file {entry.path!r} starts at row {entry.first_row}, "
                             f"expected {position}")
        position += entry.rows
    total = context_value(info, "total_rows")
    if position != total:
        raise ValueError(f"the data files hold {position} rows, the store has {total}")


@dataclass(frozen=True)
class Piece:
    """Rows of one series inside one storage block."""

    number: int  # position among all pieces of the store (a record's number)
    series_id: int
    series_rows: int  # rows of the whole series
    local_start: int  # row within the series of ``rows[0]``
    global_start: int  # global row of ``rows[0]``
    rows: np.ndarray


@dataclass(frozen=True)
class PartTask:
    """A part: a run of whole storage blocks, written on its own (maybe in a worker)."""

    number: int
    count: int  # parts in the store
    first_row: int  # global rows [first_row, first_row + rows)
    rows: int
    first_piece: int  # ``Piece.number`` of the part's first piece


#: Reads rows ``[start, stop)`` of series ``series_id`` (for a halo past a piece).
ReadSeries = Callable[[int, int, int], np.ndarray]


class RowReader(abc.ABC):
    """Reads a store's global rows; every format's reader is one.

    What a reader can do beyond :meth:`read_rows` is declared, with defaults:

    - ``fetches_together``: :meth:`read_many` fetches several row ranges with
      one call (one request or pass per file); by default it reads them one by
      one, and callers spread ranges over reader copies instead;
    - ``thread_safe``: threads may share one reader; by default each thread
      reads with its own :meth:`clone` (readers keep open, seeked handles).
    """

    block_rows: int
    fetches_together: bool = False
    thread_safe: bool = False

    @abc.abstractmethod
    def read_rows(self, start: int, stop: int) -> np.ndarray:
        """Global rows ``[start, stop)`` (``stop`` at most the store's rows) as a
        C-contiguous array of exactly ``stop - start`` rows (else ``StoreError``)."""

    def read_many(self, ranges: Sequence[tuple[int, int]]) -> list[np.ndarray]:
        """The rows of each ``(start, stop)`` range, in order."""
        return [self.read_rows(start, stop) for start, stop in ranges]

    def clone(self) -> Self:
        """An independent reader of the same rows, for another thread (it opens
        its own handles lazily); by default a pickled copy."""
        copied: Self = pickle.loads(pickle.dumps(self))
        return copied


@dataclass(frozen=True)
class ReaderSetup:
    """What a row reader needs besides the manifest's ``data`` section."""

    rows: RowLayout
    span: int  # rows one window covers
    #: raises if the store was replaced meanwhile; ``fresh=True`` asks object storage now
    check_store: Callable[..., None]
    store_id: str


class StorageFormat(Protocol):
    """A format's entry in the registry (see ``windowkit.formats.FORMATS``).

    ``prepare`` runs once before any part; ``write_part`` runs once per part,
    in any order and in any process, and returns a JSON-able summary; ``finish``
    receives the summaries in part order and returns the manifest's ``data``,
    which ``data_model`` validates when a store is opened.
    """

    name: str
    compressions: tuple[str, ...]
    default_compression: str
    target_block_bytes: int  # default storage block size: small for random access
    data_model: type[DataSection]

    def min_block_rows(self, spec: WindowSpec) -> int:
        """The smallest storage block this format accepts for ``spec``."""
        ...

    def max_data_bytes(self, layout: DataLayout, num_pieces: int) -> int:
        """An upper bound of the bytes the data files take (disk-space check)."""
        ...

    def prepare(self, data_dir: Path, layout: DataLayout, num_parts: int) -> None: ...

    def write_part(self, data_dir: Path, layout: DataLayout, part: PartTask,
                   pieces: Iterator[Piece], read_series: ReadSeries) -> dict[str, Any]: ...

    def part_files(self, data_dir: Path, layout: DataLayout, part: PartTask) -> list[str]:
        """The files (relative to ``data_dir``) that ``write_part`` writes for ``part``."""
        ...

    def finish(self, data_dir: Path, layout: DataLayout,
               parts: list[dict[str, Any]]) -> dict[str, Any]: ...

    def open_reader(self, data_dir: Path, data: dict[str, Any], setup: ReaderSetup
                    ) -> RowReader:
        """A reader of global rows; ``data`` is what ``finish`` returned (validated)."""
        ...

    # -- what the rest of windowkit asks a format about its section of a store --------
    block_name: str  # what users call a storage block of this format ("chunk", ...)

    def data_files(self, data: dict[str, Any]) -> int:
        """How many data files (parts) the store's ``data/`` has."""
        ...

    def stored_rows(self, root: Path, data: dict[str, Any]) -> int:
        """Rows the data files say they hold, from their own metadata (``verify``)."""
        ...


@runtime_checkable
class ReadsInGraph(Protocol):
    """A format that TensorFlow reads by itself, with no Python per block (what
    the tf.data service's workers need): ``isinstance(storage, ReadsInGraph)``."""

    def open_graph_reader(self, data_dir: Path, data: dict[str, Any], setup: ReaderSetup
                          ) -> Any:
        """A reader of the store's blocks in the ``tf.data`` graph alone."""
        ...


def graph_check(ok: Any, message: Callable[[], Any], *, manifest: Path, store_id: str) -> Any:
    """An op raising a windowkit error from the ``tf.data`` graph when ``ok``
    (a boolean scalar) is false: ``StoreError: <message()>`` (a string
    tensor), or ``StoreReplacedError`` when ``manifest`` no longer holds
    ``store_id`` (the store was replaced: asked before anything is called
    damage, as the Python readers ask their store guard).

    ``tf.data`` instantiates a pipeline's functions again for every iterator
    (every epoch), at a cost that grows with their ops: ``message`` should
    call a function that is not inlined (its ops then run, and are
    instantiated, only on failure), as :func:`graph_failure` is."""
    import tensorflow as tf

    return tf.cond(ok, lambda: tf.constant(0.0), lambda: graph_failure()(
        message(), str(manifest), store_id))


@cache
def graph_failure() -> Any:
    """``fail(message, manifest, store_id)``: raises (see :func:`graph_check`).

    TensorFlow's assertions escape their message; a failed number conversion
    quotes the string as it is, so the error's message ends with the line
    ``windowkit.errors.StoreError: ...``, which
    :func:`windowkit.errors.carried_error` gives back as the windowkit error."""
    import tensorflow as tf

    def fail(message: Any, manifest: Any, store_id: Any) -> Any:
        text = tf.strings.regex_replace(message, "[\r\n]", " ")
        pattern = tf.strings.join(['(?s).*"store_id":\\s*"', store_id, '".*'])
        held = tf.strings.regex_full_match(tf.io.read_file(manifest), pattern)
        root = tf.strings.regex_replace(manifest, "/[^/]*$", "")
        replaced = tf.strings.join([
            "windowkit.errors.StoreReplacedError: ", root, ": the store was replaced while it "
            "was being read (opened as store id ", tf.strings.substr(store_id, 0, 12),
            "); open it again"])
        line = tf.where(held, tf.strings.join(["windowkit.errors.StoreError: ", text]), replaced)
        return tf.strings.to_number(tf.strings.join(["\n", line]), tf.float32)

    return noinline(fail, [(tf.string, [])] * 3)


def noinline(function: Callable[..., Any], specs: Sequence[Any]) -> Any:
    """``function`` as a TensorFlow function that graphs call, not inline: its
    ops are instantiated when it first runs in an iterator, not with the
    pipeline (a failure path never runs), and it is traced once (its
    arguments: ``(dtype, shape)`` each, ``None`` dimensions of any size)."""
    import tensorflow as tf

    return tf.function(function, autograph=False,
                       input_signature=[tf.TensorSpec(shape, dtype) for dtype, shape in specs],
                       experimental_attributes={"_noinline": True})


def plain_call(function: Any, *args: Any) -> list[Any]:
    """Call a (not inlined) TensorFlow function without TensorFlow's graph
    optimizer (grappler): ``tf.data`` instantiates a pipeline's functions
    again for every iterator, and on these integer- and string-heavy graphs
    the optimizer's passes cost more each epoch than they save. ``function``:
    a ``tf.function`` with an input signature (as :func:`noinline` makes)."""
    import tensorflow as tf
    from tensorflow.core.protobuf import config_pb2

    config = config_pb2.ConfigProto()
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    concrete = function.get_concrete_function()
    outputs = tf.nest.flatten(concrete.structured_outputs)
    stateful = any(op.op_def.is_stateful for op in concrete.graph.get_operations())
    call = tf.raw_ops.StatefulPartitionedCall if stateful else tf.raw_ops.PartitionedCall
    return call(args=[*args, *concrete.captured_inputs],
                Tout=[t.dtype for t in outputs], f=concrete,
                config_proto=config.SerializeToString())
