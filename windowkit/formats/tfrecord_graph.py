"""TFRecord parts (data files) read by TensorFlow's own ops, with no Python per
record or per group: the default read path of a local TFRecord store's
``tf_dataset``, and what a tf.data service worker runs (it has TensorFlow,
not windowkit).

Two readers of the store's records (one series inside one block, with its halo):

- :meth:`TFRecordGraphReader.blocks` (:class:`RecordBlocks`): groups of
  storage blocks, for :mod:`windowkit.readers.tfdata.reads`
  (uncompressed parts: a GZIP part inflates from its start, so those stores
  keep the NumPy path). A group's records are runs of neighbours in a part;
  each run is one ranged read (``TFRecordDatasetV2`` from the run's byte
  offset, ``take`` its records) under a parallel ``interleave``, so a group
  reads its own bytes only, whatever the order of its blocks.
- :meth:`TFRecordGraphReader.pieces`: every wanted record, whole part files
  streamed (the tf.data service hands files out among its workers).

Checked in the graph (:class:`RecordBlocks`), as
:class:`windowkit.formats.tfrecord_rows.TFRecordRowReader` checks them: both
CRCs of every record (TensorFlow's reader), that every record asked for came
(in order: a run's reader stops at a record that fails a check), its number,
store tag, series, rows, halo and step shape against the records table, and
its bytes of rows. A failed check is one windowkit error naming the part,
record and byte, or the store replaced (:func:`windowkit.formats.base.graph_check`);
the per-block digests are checked by the caller, on the rows returned. Done
in Python once, when the dataset is built: the records table, the store guard
(in the graph, the manifest is read again only when a check fails). Done in
Python at every group read, before TensorFlow opens a part by name: that each
part it reads leads (through any links) to a regular file, so a part swapped
for a FIFO, a socket or a directory after the dataset was built is one line,
never a reader waiting forever. (:meth:`TFRecordGraphReader.pieces`, what a
tf.data service worker runs, has TensorFlow alone there: its parts are checked
when the dataset is built.)
"""

from __future__ import annotations

import os
import re
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from windowkit.errors import StoreError
from windowkit.formats._checks import ask_guard, check_regular
from windowkit.formats.base import ReaderSetup, graph_check, noinline, store_tag
from windowkit.formats.tfrecord_io import (
    HEADER_BYTES,
    RecordError,
    check_header,
    unframe_record,
)
from windowkit.location import open_regular, refuse_special

if TYPE_CHECKING:
    import tensorflow as tf

RECORD_FILES_AT_ONCE = 4  # part files read from at once (pieces)
RUNS_AT_ONCE = 4  # runs of records of a group read at once (blocks)
READ_BUFFER_BYTES = 1 << 20  # a run's read buffer: its bytes, at most this
_INTS = ("record", "store", "series", "row", "rows", "halo")  # int64 features checked
#: The checks of a record (its int features, its shape, its bytes of rows) in the
#: order the Python reader makes them: the store tag first
_CHECK_ORDER = [1, 0, *range(2, len(_INTS) + 2)]


def ranged_reads() -> bool:
    """Whether this TensorFlow reads a TFRecord file from a byte offset
    (``TFRecordDatasetV2``; older versions: the NumPy path reads the groups)."""
    from tensorflow.python.ops import gen_dataset_ops

    return hasattr(gen_dataset_ops, "tf_record_dataset_v2")


def _records_from(path: tf.Tensor, offset: tf.Tensor, buffer: tf.Tensor) -> tf.data.Dataset:
    """The records of an uncompressed TFRecord file from byte ``offset`` on."""
    import tensorflow as tf
    from tensorflow.python.data.ops import dataset_ops
    from tensorflow.python.ops import gen_dataset_ops

    class RangedRecords(dataset_ops.DatasetSource):  # what TFRecordDataset lacks: an offset
        def __init__(self) -> None:
            self._name = None
            super().__init__(gen_dataset_ops.tf_record_dataset_v2(
                path[None], "", buffer, offset[None],
                metadata=self._metadata.SerializeToString()))

        @property
        def element_spec(self) -> tf.TensorSpec:
            return tf.TensorSpec([], tf.string)

    return RangedRecords()


class TFRecordGraphReader:
    """The store's pieces (records: one series inside one block, with its halo)
    for ``tf.data`` pipelines."""

    def __init__(self, data_dir: Path, data: dict[str, Any], setup: ReaderSetup,
                 records: Any) -> None:
        self._root = data_dir.parent
        self._data = data
        self._setup = setup
        self._records = records  # the checked records table (``RecordTable``)

    @property
    def piece_first_row(self) -> np.ndarray:
        """Global row of each piece's first row."""
        return self._records["global_row"]

    @property
    def piece_rows(self) -> np.ndarray:
        """Rows of each piece (without its halo)."""
        return self._records["rows"]

    @property
    def reads_blocks(self) -> bool:
        """Whether :meth:`blocks` can read this store: uncompressed parts (a
        GZIP part inflates from its start) and a TensorFlow with ranged reads."""
        return self._data.get("compression") != "gzip" and ranged_reads()

    def blocks(self, manifest: Path, blocks: np.ndarray) -> RecordBlocks:
        """A reader of groups of ``blocks`` (``manifest``: the store's manifest
        file, asked whether the store was replaced before a failure is called
        damage)."""
        return RecordBlocks(self._root, self._data, self._setup, self._records, manifest,
                            blocks)

    def pieces(self, wanted: np.ndarray, *, shuffle: bool, seed: int) -> tf.data.Dataset:
        """``(piece, rows)`` for each piece where ``wanted`` is true, reading only
        the part files that hold such pieces (in a seeded random order when
        ``shuffle``). The file list is the pipeline's source, so the tf.data
        service can hand the files out among its workers."""
        import tensorflow as tf

        # "shard" and "shards": the on-disk names of the parts (data files), kept
        files = np.unique(self._records["shard"][wanted])
        paths = [str(self._root / self._data["shards"][int(i)]["path"]) for i in files]
        keep = tf.constant(np.asarray(wanted, dtype=bool))
        compression = "GZIP" if self._data.get("compression") == "gzip" else ""
        dtype = tf.as_dtype(self._setup.rows.dtype.newbyteorder("="))
        step_shape = list(self._setup.rows.step_shape)
        tag = tf.constant(store_tag(self._setup.store_id), tf.int64)
        where = str(self._root)
        features = {"record": tf.io.FixedLenFeature([], tf.int64),
                    "store": tf.io.FixedLenFeature([], tf.int64),
                    "data": tf.io.FixedLenFeature([], tf.string)}

        def parse(serialized: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            record = tf.io.parse_single_example(serialized, features)
            check = tf.debugging.assert_equal(
                record["store"], tag, message=f"{where}: a record belongs to another store")
            with tf.control_dependencies([check]):
                return tf.identity(record["record"]), record["data"]

        def decode(piece: tf.Tensor, data: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            rows = tf.io.decode_raw(data, dtype, little_endian=True)
            return piece, tf.reshape(rows, [-1, *step_shape])

        ds = tf.data.Dataset.from_tensor_slices(paths)
        if shuffle:
            ds = ds.shuffle(len(paths), seed=seed, reshuffle_each_iteration=True)
        ds = ds.interleave(lambda path: tf.data.TFRecordDataset(path, compression),
                           cycle_length=RECORD_FILES_AT_ONCE,
                           num_parallel_calls=tf.data.AUTOTUNE, deterministic=not shuffle)
        ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE)
        ds = ds.filter(lambda piece, _: tf.gather(keep, piece))
        return ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=not shuffle)


def decode_rows(data: tf.Tensor, dtype: np.dtype, step_shape: tuple[int, ...]) -> tf.Tensor:
    """Raw little-endian rows (a string) as a ``[rows, *step_shape]`` tensor."""
    import tensorflow as tf

    wanted = tf.as_dtype(np.dtype(dtype).newbyteorder("="))
    signed = {tf.uint32: tf.int32, tf.uint64: tf.int64}.get(wanted, wanted)  # decode_raw's
    values = tf.io.decode_raw(data, signed, little_endian=True)
    return tf.reshape(values if signed == wanted else tf.bitcast(values, wanted),
                      [-1, *step_shape])


class RecordBlocks:
    """Groups of storage blocks read from their records in the graph, in two
    steps:

    - :meth:`stored` ``(blocks)``: a dataset of one element, the blocks'
      records as stored (serialized Examples, their CRCs checked);
    - :meth:`decode` ``(blocks, stored)``: ``(rows, raw, offsets, halos)``,
      every record checked; block ``blocks[i]`` starts at ``rows[offsets[i]]``,
      its rows followed by the ``halos[i]`` rows that its last record holds past
      it (the next rows of that series, which windows starting in the block
      reach); ``raw`` is ``rows`` as stored (little-endian bytes), for the
      digests.

    ``blocks`` ascend. A record never crosses a block (checked here), so each
    block is one run of rows. A group reads :meth:`with_next` of its blocks:
    a halo cut short by the end of its series holds part of the next block's
    head only, so that block is read too, and the halo compared with it.

    Checked here, in Python, before any read: every record of the blocks
    whole in its part, with a header whose CRC holds and whose length is the
    records table's (TensorFlow's reader allocates what a header claims).
    """

    def __init__(self, root: Path, data: dict[str, Any], setup: ReaderSetup, records: Any,
                 manifest: Path, blocks: np.ndarray) -> None:
        import tensorflow as tf

        layout, table = setup.rows, records
        block_of = table["global_row"] // layout.block_rows
        if not np.array_equal(block_of, (table["global_row"] + table["rows"] - 1)
                              // layout.block_rows):
            raise StoreError(f"{root / data['records']}: a record holds rows of two storage "
                             "blocks")
        paths = [root / part["path"] for part in data["shards"]]
        for path in paths:
            check_regular(path)
        every = np.arange(layout.num_blocks)
        first = np.searchsorted(block_of, every)
        count = np.searchsorted(block_of, every, side="right") - first
        self.short_halos = _short_halos(table, first + count - 1, count, setup)
        self.read_blocks = np.union1d(blocks, blocks[self.short_halos[blocks]] + 1)
        check_headers(paths, table, np.flatnonzero(np.isin(block_of, self.read_blocks)), setup)
        setup.check_store()  # the parts seen are this store's
        self._first = tf.constant(first, tf.int64)
        self._count = tf.constant(count, tf.int64)
        self._short = tf.constant(self.short_halos)
        self._table = {name: tf.constant(table[name], tf.int64)
                       for name in ("shard", "offset", "bytes", *_INTS[2:])}
        self._paths = tf.constant([str(p) for p in paths])
        self._patterns = tf.constant([re.sub(r"([*?\[\]\\])", r"\\\1", str(p))
                                      for p in paths])
        self._setup, self._manifest = setup, manifest
        self._tag = store_tag(setup.store_id)

    def check(self, ok: tf.Tensor, message: Any) -> tf.Tensor:
        """:func:`graph_check` for this store."""
        return graph_check(ok, message, manifest=self._manifest,
                           store_id=self._setup.store_id)

    def describe(self, block: tf.Tensor) -> tf.Tensor:
        """Where block ``block`` lies (its first record), for messages."""
        import tensorflow as tf

        record = tf.gather(self._first, block)
        return _where(record, tf.gather(self._paths, tf.gather(self._table["shard"], record)),
                      tf.gather(self._table["offset"], record))

    def with_next(self, blocks: tf.Tensor) -> tf.Tensor:
        """``blocks`` (ascending) and the block after each whose halo is cut short."""
        import tensorflow as tf

        extra = tf.boolean_mask(blocks + 1, tf.gather(self._short, blocks))
        return tf.unique(tf.sort(tf.concat([blocks, extra], 0))).y

    def _records(self, blocks: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """The records of ``blocks`` (ascending), and how many each block has."""
        import tensorflow as tf

        first, count = tf.gather(self._first, blocks), tf.gather(self._count, blocks)
        return tf.ragged.range(first, first + count).flat_values, count

    def stored(self, blocks: tf.Tensor) -> tf.data.Dataset:
        """The records of ``blocks`` as stored, one element: each run of
        neighbours in a part one ranged read, runs read in parallel, in order;
        fewer than asked where a record failed TensorFlow's checks."""
        import tensorflow as tf

        records, _ = self._records(blocks)
        part = tf.gather(self._table["shard"], records)
        offset, size = (tf.gather(self._table[name], records) for name in ("offset", "bytes"))
        new = tf.reduce_any(tf.stack([  # where a run starts
            tf.not_equal(records, tf.roll(records, 1, 0) + 1),
            tf.not_equal(part, tf.roll(part, 1, 0)),
            tf.not_equal(offset, tf.roll(offset + size, 1, 0)),
            tf.equal(tf.range(tf.size(records, out_type=tf.int64)), 0)]), 0)
        run = tf.cumsum(tf.cast(new, tf.int64)) - 1
        starts = tf.reshape(tf.where(new), [-1])
        heads = tf.gather(part, starts)
        checked = tf.numpy_function(  # before TensorFlow opens them by name: no FIFO
            regular_parts, [tf.gather(self._paths, tf.unique(heads).y)], tf.bool,
            stateful=True)
        with tf.control_dependencies([checked]):
            heads = tf.identity(heads)
        count = tf.math.unsorted_segment_sum(tf.ones_like(records), run, tf.size(starts))
        source = tf.data.Dataset.from_tensor_slices((
            tf.gather(self._patterns, heads), tf.gather(self._paths, heads),
            tf.gather(offset, starts), count,
            tf.math.unsorted_segment_sum(size, run, tf.size(starts))))
        # a run's records one after the other (block_length: the longest run), the
        # next runs read meanwhile
        return source.interleave(
            tf.autograph.experimental.do_not_convert(_run), cycle_length=RUNS_AT_ONCE,
            block_length=tf.reduce_max(count), num_parallel_calls=RUNS_AT_ONCE,
            deterministic=True).batch(tf.size(records, out_type=tf.int64)).concatenate(
                tf.data.Dataset.from_tensors(tf.zeros([0], tf.string))).take(1)

    def decode(self, blocks: tf.Tensor, stored: tf.Tensor
               ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
        """``(rows, raw, offsets, halos)`` of ``blocks`` from their ``stored`` records."""
        import tensorflow as tf

        records, count = self._records(blocks)
        raw = tf.strings.reduce_join(self._checked(stored, records))
        rows = decode_rows(raw, self._setup.rows.dtype, self._setup.rows.step_shape)
        lengths = tf.gather(self._table["rows"] + self._table["halo"], records)
        starts = tf.cumsum(lengths, exclusive=True)  # of each record in rows
        heads = tf.cumsum(count, exclusive=True)  # each block's first record, among records
        halos = tf.gather(self._table["halo"], tf.gather(records, heads + count - 1))
        return rows, raw, tf.gather(starts, heads), halos

    def _checked(self, stored: tf.Tensor, records: tf.Tensor) -> tf.Tensor:
        """The records' bytes of rows, once every record asked for came and says
        what the records table says of it (else one error, on the first that
        does not)."""
        import tensorflow as tf

        features: dict[str, Any] = {name: tf.io.FixedLenFeature([], tf.int64, default_value=-1)
                                    for name in _INTS}
        features["shape"] = tf.io.RaggedFeature(tf.int64)
        features["data"] = tf.io.FixedLenFeature([], tf.string, default_value="")
        got = tf.io.parse_example(stored, features)
        came = records[:tf.size(stored)]
        found = tf.stack([got[name] for name in _INTS], 1)  # [came, ints]
        expected = tf.stack([came, tf.fill(tf.shape(came), tf.constant(self._tag, tf.int64)),
                             *(tf.gather(self._table[name], came) for name in _INTS[2:])], 1)
        rank = len(self._setup.rows.step_shape)
        shape_ok = tf.logical_and(tf.equal(got["shape"].row_lengths(), rank), tf.reduce_all(
            tf.equal(got["shape"].to_tensor(-1, shape=[None, rank]),
                     self._setup.rows.step_shape), 1))
        length = tf.cast(tf.strings.length(got["data"]), tf.int64)
        rows_halo = tf.reduce_sum(tf.gather(expected, [4, 5], axis=1), 1)
        failed = tf.logical_not(tf.concat([tf.equal(found, expected), tf.stack([
            shape_ok, tf.equal(length, rows_halo * self._setup.rows.row_bytes)], 1)], 1))
        ok = tf.logical_and(tf.logical_not(tf.reduce_any(failed)),
                            tf.equal(tf.size(stored), tf.size(records)))
        rows = self._setup.rows
        check = self.check(ok, lambda: record_problem()(
            records, tf.equal(tf.strings.length(stored), 0), found, expected, length, failed,
            got["shape"].flat_values, tf.cast(got["shape"].row_splits, tf.int64),
            self._table["shard"],
            self._table["offset"], self._table["bytes"], self._paths, self._patterns,
            f"{list(rows.step_shape)}", f" rows of {rows.cells} {rows.dtype} values"))
        with tf.control_dependencies([check]):
            return tf.identity(got["data"])


def regular_parts(paths: np.ndarray) -> np.bool_:
    """Each of ``paths`` (bytes) that is there leads to a regular file, else one
    :class:`StoreError` line naming it (a missing part is named by the read)."""
    for path in paths:
        refuse_special(os.fsdecode(path))
    return np.bool_(True)


def _run(pattern: tf.Tensor, path: tf.Tensor, offset: tf.Tensor, count: tf.Tensor,
         size: tf.Tensor) -> tf.data.Dataset:
    """The ``count`` records from byte ``offset`` of the part at ``path``.

    A record failing TensorFlow's checks (a CRC, a truncated file) ends the run
    (``ignore_errors``: its reader moves past the file), so that the caller
    names it: an empty string stands in for it and every record after it. A
    part that cannot be opened would be tried again forever: a missing part is
    not read at all (the caller names it too)."""
    import tensorflow as tf

    there = tf.size(tf.io.matching_files(pattern)) > 0
    came = _records_from(path, offset, tf.minimum(size, READ_BUFFER_BYTES)).take(
        tf.where(there, count, 0)).ignore_errors(log_warning=False)
    return came.concatenate(tf.data.Dataset.from_tensors(tf.constant("")).repeat()).take(count)


def _short_halos(table: Any, last: np.ndarray, count: np.ndarray, setup: ReaderSetup
                 ) -> np.ndarray:
    """Whether each block's halo (its last record's) is cut short by the end
    of its series: it holds part of the next block's head only, which the
    head's digest cannot check."""
    layout = setup.rows
    halo = np.where(count > 0, table["halo"][np.maximum(last, 0)], 0)
    rows = np.minimum(layout.block_rows,
                      layout.total_rows - np.arange(layout.num_blocks) * layout.block_rows)
    head = np.minimum(setup.span - 1, np.append(rows[1:], 0))  # the next block's
    return np.asarray((halo > 0) & (halo < head), dtype=bool)


def check_headers(paths: list[Path], table: Any, records: np.ndarray, setup: ReaderSetup
                  ) -> None:
    """Each of ``records`` (ascending) whole in its part, its header's CRC
    holding and its length the records table's: one 12-byte read a record, so
    that no claim of a header is ever allocated. A failure is the line the
    Python reader gives for the first record it would refuse: the first
    failing header, unless the data of a record before it fails its CRC."""
    part, offset, size = table["shard"], table["offset"], table["bytes"]
    parts = [int(p) for p in np.unique(part[records])]
    with _PartFiles(paths, parts, setup) as files:
        bad = min((found for number in parts if (found := files.first_bad_header(
            number, records[part[records] == number], offset, size)) is not None),
            default=None)
        if bad is None:
            return
        for record in records[records < bad[0]]:  # the Python reader reads these first
            stored = files.read(int(part[record]), int(offset[record]), int(size[record]))
            try:
                unframe_record(stored, gzip=False)
            except RecordError as exc:
                bad = (int(record), str(exc))
                break
    ask_guard(setup)  # a replaced store says so, never "corrupt"
    record = bad[0]
    raise StoreError(f"{paths[int(part[record])]}: record {record} at byte "
                     f"{int(offset[record])}: {bad[1]}")


class _PartFiles:
    """The parts of a store opened for reading (never waiting on a FIFO), each
    leading to a regular file, for :func:`check_headers`."""

    def __init__(self, paths: list[Path], parts: list[int], setup: ReaderSetup) -> None:
        self._paths, self._parts, self._setup = paths, parts, setup
        self._files: dict[int, tuple[int, int]] = {}  # part: (descriptor, bytes)

    def __enter__(self) -> _PartFiles:
        for number in self._parts:
            try:
                fd = open_regular(self._paths[number])
            except StoreError:
                self.__exit__()
                ask_guard(self._setup)  # a replaced store says so, never "missing"
                raise
            self._files[number] = (fd, os.fstat(fd).st_size)
        return self

    def __exit__(self, *_: object) -> None:
        for fd, _size in self._files.values():
            os.close(fd)
        self._files.clear()

    def read(self, number: int, at: int, size: int) -> bytes:
        return os.pread(self._files[number][0], size, at)

    def first_bad_header(self, number: int, records: np.ndarray, offset: np.ndarray,
                         size: np.ndarray) -> tuple[int, str] | None:
        """The first of ``records`` (in part ``number``) that is not whole in the
        part or whose header fails, and why; None if none."""
        fd, file_bytes = self._files[number]
        for record in records:
            at, want = int(offset[record]), int(size[record])
            have = min(want, max(0, file_bytes - at))
            try:
                if have < want:
                    raise RecordError(f"file is truncated ({have} of {want} bytes)")
                check_header(os.pread(fd, HEADER_BYTES, at), want)
            except RecordError as exc:
                return int(record), str(exc)
        return None


def _where(record: tf.Tensor, path: tf.Tensor, offset: tf.Tensor) -> tf.Tensor:
    """``<part>: record <n> at byte <offset>``, for messages."""
    import tensorflow as tf

    text = tf.strings.as_string
    return tf.strings.join([path, ": record ", text(record), " at byte ", text(offset)])


@cache
def record_problem() -> Any:
    """``problem(records, missing, found, expected, length, failed, *table, shape,
    values)``: what is wrong with the first record that failed a check
    (``failed``: ``[records, checks]``), or that did not come (``missing``: a
    run's reader stops at a record it refuses). Not inlined: it is built, and
    runs, only on failure."""
    import tensorflow as tf

    def problem(records: Any, missing: Any, found: Any, expected: Any, length: Any,
                failed: Any, shapes: Any, shape_splits: Any, part: Any, offset: Any, size: Any,
                paths: Any, patterns: Any, shape: Any, values: Any) -> Any:
        came = tf.shape(failed, out_type=tf.int64)[0]
        bad = tf.reduce_any(failed, 1)
        # the first failing record, else `came` (none came, or all that came are good)
        i = tf.argmax(tf.concat([bad, [True]], 0))

        def at_i(table: Any, pad: Any) -> Any:  # row i (came: the padding)
            return tf.concat([table, tf.cast(tf.fill([1, tf.shape(table)[1]], pad),
                                             table.dtype)], 0)[i]

        got, want = at_i(found, -1), at_i(expected, -1)
        skipped = tf.logical_or(i >= came, tf.concat([missing, [True]], 0)[i])
        # checked in the Python reader's order: the store tag, then the fields
        order = tf.constant(_CHECK_ORDER)
        first = tf.gather(order, tf.argmax(tf.gather(at_i(failed, False), order),
                                           output_type=tf.int32))
        kind = tf.where(skipped, 0, 1 + first)
        record = records[i]
        where = _where(record, tf.gather(paths, part[record]), offset[record])
        text = tf.strings.as_string
        fields = tf.strings.join([_FIELD_TEXT[0], text(got), _FIELD_TEXT[1], text(want),
                                  _FIELD_TEXT[2]])
        why = tf.concat([
            [_refused(paths[part[record]], patterns[part[record]], offset[record],
                      size[record])], fields,
            [tf.strings.join([": field 'shape' is [", tf.strings.reduce_join(text(
                shapes[shape_splits[i]:shape_splits[tf.minimum(i + 1, came)]]),
                separator=", "), "], the records table says ", shape]),
             tf.strings.join([": holds ", text(tf.concat([length, [-1]], 0)[i]),
                              " bytes of rows, expected ", text(want[4] + want[5]), values])]],
            0)
        return tf.strings.join([where, why[kind]])

    vector, table = [None], [None, None]
    return noinline(problem, [(tf.int64, vector), (tf.bool, vector), (tf.int64, table),
                              (tf.int64, table),
                              (tf.int64, vector), (tf.bool, table), *[(tf.int64, vector)] * 5,
                              (tf.string, vector), (tf.string, vector), (tf.string, []),
                              (tf.string, [])])


#: What a record's int features are called in messages: before its value, between
#: it and the records table's, after (the store tag has its own words).
_FIELD_TEXT = [[f": field {name!r} is [" for name in _INTS],
               ["], the records table says ["] * len(_INTS), ["]"] * len(_INTS)]
_FIELD_TEXT[0][1], _FIELD_TEXT[1][1], _FIELD_TEXT[2][1] = (
    ": belongs to another store (store tag ", ", expected ", ")")


def _refused(path: tf.Tensor, pattern: tf.Tensor, offset: tf.Tensor, size: tf.Tensor
             ) -> tf.Tensor:
    """Why TensorFlow's reader refused a record: its part is missing, or ends
    inside it, else its data fails its CRC check (its header was checked
    before the read, :func:`check_headers`)."""
    import tensorflow as tf

    there = tf.size(tf.io.matching_files(pattern)) > 0
    have = tf.cond(there, lambda: _bytes_from(path, offset, size),
                   lambda: tf.constant(0, tf.int64))
    text = tf.strings.as_string
    return tf.where(there, tf.where(
        have < size, tf.strings.join([": file is truncated (", text(have), " of ",
                                      text(size), " bytes)"]),
        ": record data fails its CRC check"), ": its part file is missing")


def _bytes_from(path: tf.Tensor, offset: tf.Tensor, most: tf.Tensor) -> tf.Tensor:
    """How many bytes the file at ``path`` holds from byte ``offset`` on, at
    most ``most``: a binary search of one-byte reads, never the whole file."""
    import tensorflow as tf

    def there(k: tf.Tensor) -> tf.Tensor:  # whether the file holds byte offset + k
        byte = tf.data.FixedLengthRecordDataset(path, 1, header_bytes=offset + k).take(1)
        return byte.ignore_errors(log_warning=False).reduce(
            tf.constant(0, tf.int64), lambda n, _: n + 1) > 0

    def halve(lo: tf.Tensor, hi: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        mid = (lo + hi + 1) // 2  # bytes [0, lo) are there; none from hi on (hi < most)
        return tf.cond(there(mid - 1), lambda: (mid, hi), lambda: (lo, mid - 1))

    lo, _ = tf.while_loop(lambda lo, hi: lo < hi, halve,
                          (tf.constant(0, tf.int64), tf.cast(most, tf.int64)))
    return lo
