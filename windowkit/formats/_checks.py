"""Per-block digests: every block a reader decodes is checked against what was written.

At write time each storage block (``block_rows`` global rows, the unit every
format decodes) gets two xxh3-64 digests of its decoded rows: one of the whole
block, one of its *head* (its first ``span - 1`` rows, the halo the block
before it is read with). The seed binds them to the store (its id, dtype, step
shape, block rows and halo) and to the block's number, so a block of another
store, a block moved elsewhere or rows read with another dtype never match.
They are kept in ``data/_blocks.xxh3`` (little-endian uint64 pairs, one pair per
block, listed in the manifest's files), read once when a reader first reads.

:class:`CheckedReader` wraps every format's row reader (the formats' ``open_reader``
return one): a read is widened to whole blocks (or a block plus the next one's
head) and every block is checked before any of its rows is returned. On a
mismatch the store guard is asked first: a replaced store is
:class:`~windowkit.errors.StoreReplacedError`, anything else a ``StoreError``
naming the file and block.
"""

from __future__ import annotations

import copy
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from windowkit.errors import StoreError, StoreUnreachableError
from windowkit.formats.base import DataLayout, Piece, ReaderSetup, RowReader
from windowkit.location import is_remote, not_regular, open_regular, read_ranges

#: beside data/, not in it: data/ of a Parquet store is then its table alone, which
#: Polars, DuckDB and Spark read as it is (a store written before keeps it in data/,
#: where its manifest says)
DIGEST_FILE = "blocks.xxh3"
_MASK = (1 << 64) - 1

#: Where a block lies (``"<file>: <unit>"``), for messages.
Describe = Callable[[int], str]

#: Private switch, for ``tests/benchmarks/benchmark.py`` alone (checks on vs. off).
_CHECKS = True

CHECKS_PER_THREAD = 8  # blocks digested per hand-over to a thread (a block: ~50 us)


def digest_base(store_id: str, dtype: np.dtype, step_shape: tuple[int, ...],
                block_rows: int, halo: int) -> int:
    """The seed of block 0: the store id and the rows' layout, hashed."""
    key = f"{store_id}|{np.dtype(dtype).str}|{tuple(step_shape)}|{block_rows}|{halo}"
    return xxhash.xxh3_64_intdigest(key.encode())


def _seeds(base: int, block: int) -> tuple[int, int]:
    """The seeds of block ``block``'s whole-block and head digests."""
    return (base + 2 * block) & _MASK, (base + 2 * block + 1) & _MASK


class BlockDigester:
    """Digests the blocks of one part from its pieces, as they are written."""

    def __init__(self, layout: DataLayout) -> None:
        self._layout = layout
        self._halo = layout.window.span - 1
        self._base = digest_base(layout.store_id, layout.rows.dtype, layout.rows.step_shape,
                                 layout.rows.block_rows, self._halo)
        self._block = -1
        self._full: Any = None
        self._head: Any = None
        self._head_left = 0
        self.digests: list[list[int]] = []

    def wrap(self, pieces: Iterator[Piece]) -> Iterator[Piece]:
        """``pieces`` unchanged, each digested on its way to the writer."""
        for piece in pieces:
            self.add(piece.global_start, piece.rows)
            yield piece

    def add(self, global_start: int, rows: np.ndarray) -> None:
        """Rows following those added before (a new block may start with them)."""
        size = self._layout.rows.block_rows
        data = np.ascontiguousarray(rows, dtype=self._layout.rows.dtype)
        while len(data):
            block = global_start // size
            if block != self._block:
                self._close()
                self._open(block)
            take = min(len(data), (block + 1) * size - global_start)
            taken = data[:take]
            self._full.update(taken)
            if self._head_left:
                self._head.update(taken[:self._head_left])
                self._head_left -= min(self._head_left, take)
            data, global_start = data[take:], global_start + take

    def _open(self, block: int) -> None:
        full, head = _seeds(self._base, block)
        self._block = block
        self._full, self._head = xxhash.xxh3_64(seed=full), xxhash.xxh3_64(seed=head)
        start, stop = self._layout.rows.block_range(block)
        rows = stop - start
        self._head_left = min(self._halo, rows)

    def _close(self) -> None:
        if self._full is not None:
            self.digests.append([self._full.intdigest(), self._head.intdigest()])
            self._full = None

    def summary(self) -> dict[str, Any]:
        """What ``write_part`` adds to its summary: the first block and the digests."""
        first = self._block - len(self.digests)
        self._close()
        return {"first_block": first, "digests": self.digests}


def write_digests(data_dir: Path, layout: DataLayout, parts: list[dict[str, Any]]) -> str:
    """Write ``blocks.xxh3`` (beside ``data/``) from the parts' summaries (in
    part order); return its path in the store, for the manifest's ``data``
    section."""
    pairs = [pair for part in parts for pair in part["digests"]]
    if len(pairs) != layout.rows.num_blocks or (parts and parts[0]["first_block"] != 0):
        raise StoreError(f"{data_dir}: the parts digested {len(pairs)} blocks, the store "
                         f"has {layout.rows.num_blocks}")
    table = np.array(pairs, dtype=np.uint64).reshape(-1, 2).astype("<u8")
    with open(data_dir.parent / DIGEST_FILE, "wb") as out:
        out.write(table.tobytes())
        out.flush()
        os.fsync(out.fileno())
    return DIGEST_FILE


def ask_guard(setup: ReaderSetup) -> None:
    """Ask the store guard, afresh, whether the store was replaced (it raises
    ``StoreReplacedError`` if so): before any read failure is called corruption.
    Not when the failure being handled is object storage that did not answer
    (:class:`StoreUnreachableError`): asking would wait on the same server again."""
    if not _unreachable(sys.exc_info()[1]):
        setup.check_store(fresh=True)


def _unreachable(error: BaseException | None) -> bool:
    """Whether ``error``, or an error it was raised from, is a store that did not answer."""
    seen = 0
    while error is not None and seen < 16:
        if isinstance(error, StoreUnreachableError):
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


def check_regular(path: Path | str) -> None:
    """A local data file must lead (through any links: a store behind a
    symlink, a DVC or git-annex checkout) to a regular file, not a FIFO, a
    device, a socket or a directory (a FIFO would block its reader forever):
    one line if not. What is checked before a library opens the file; every
    block read from it is then checked against its digest."""
    if is_remote(path):
        return
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise StoreError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    error = not_regular(path, mode)
    if error is not None:
        raise error


def read_file(path: Path, limit: int) -> bytes:
    """The bytes of a data file, at most ``limit`` (else one line): a local file
    must lead to a regular file (:func:`~windowkit.location.open_regular`)."""
    if not is_remote(path):
        return read_local(str(path), limit)
    try:
        blob = read_ranges([path], [0], [limit + 1])[0]
    except StoreError:
        raise
    except OSError as exc:
        raise StoreError(f"{path}: cannot read ({exc})") from exc
    if len(blob) > limit:
        raise StoreError(f"{path}: holds more than the {limit} bytes it can (refused)")
    return blob


def read_local(path: str, limit: int) -> bytes:
    """:func:`read_file` of a local file named by a string (what a reader of
    many small files calls per file: no ``pathlib``), opened with
    :func:`~windowkit.location.open_regular` (links followed, never blocking:
    a FIFO or a directory is one line), then read outside the interpreter lock."""
    fd = open_regular(path)
    try:
        blob = os.pread(fd, limit + 1, 0)
    except OSError as exc:
        raise StoreError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    finally:
        os.close(fd)
    if len(blob) > limit:
        raise StoreError(f"{path}: holds more than the {limit} bytes it can (refused)")
    return blob


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask where the system
    has one: a process pinned to 2 cores of 64 counts 2)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


_POOL: ThreadPoolExecutor | None = None  # the decode threads, made on first use
_POOL_LOCK = threading.Lock()


def _forget_pool() -> None:
    """In a forked child: the parent's threads are not there; make new ones."""
    global _POOL, _POOL_LOCK
    _POOL, _POOL_LOCK = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def _pool() -> ThreadPoolExecutor:
    """The process's pool of decode threads (one per usable core, less this one)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max(1, usable_cores() - 1),
                                       thread_name_prefix="windowkit-decode")
        return _POOL


def in_threads(work: Callable[[int], object], count: int, *, least: int = 1) -> None:
    """``work(0) .. work(count - 1)`` (independent: each writes its own part of
    an output), spread over the usable cores: contiguous runs of at least
    ``least`` of them (what is worth a hand-over to a thread), one in this
    thread and the others in the decode pool. For work that spends its time
    outside the interpreter lock (decompression, hashing, copies); the first
    error raised is raised here, after every run has ended."""
    runs = min(count // max(1, least), usable_cores())
    if runs <= 1:
        for i in range(count):
            work(i)
        return

    def run(k: int) -> None:
        for i in range(k * count // runs, (k + 1) * count // runs):
            work(i)

    pending = [_pool().submit(run, k) for k in range(1, runs)]
    try:
        run(0)
    finally:
        errors = [f.exception() for f in pending]  # waits for every run
    for error in errors:
        if error is not None:
            raise error


class CheckedReader(RowReader):
    """A format's row reader whose every block is checked against its digest.

    A read ``[start, stop)`` is widened to whole blocks, except a trailing
    block's head (the halo a read of the block before ends with) when the read
    ends exactly there; each block (or head) is digested and compared before
    the rows are returned."""

    def __init__(self, inner: Any, digests_path: Path, setup: ReaderSetup,
                 describe: Describe | None = None) -> None:
        self.inner = inner
        self.block_rows = setup.rows.block_rows
        self._path = digests_path
        self._setup = setup
        self._halo = setup.span - 1
        self._base = digest_base(setup.store_id, setup.rows.dtype, setup.rows.step_shape,
                                 setup.rows.block_rows, self._halo)
        self._table: np.ndarray | None = None
        self._describe = describe  # block -> "file: unit" for messages
        self.fetches_together = inner.fetches_together

    def __copy__(self) -> CheckedReader:
        twin = object.__new__(CheckedReader)
        twin.__dict__.update({**self.__dict__, "inner": copy.copy(self.inner)})
        return twin

    @property
    def table(self) -> np.ndarray:
        """``[blocks, 2]`` uint64: each block's whole-block and head digests."""
        if self._table is None:
            blocks = self._setup.rows.num_blocks
            blob = read_file(self._path, 16 * blocks)
            self._setup.check_store()  # after the read: the digests were this store's
            if len(blob) != 16 * blocks:
                raise StoreError(f"{self._path}: holds {len(blob)} bytes, expected "
                                 f"{16 * blocks} (two digests for each of {blocks} blocks)")
            self._table = np.frombuffer(blob, dtype="<u8").reshape(blocks, 2)
        return self._table

    def _widen(self, start: int, stop: int) -> tuple[int, int]:
        """The range read for ``[start, stop)``: whole blocks, or whole blocks and
        the next block's head."""
        size, total = self.block_rows, self._setup.rows.total_rows
        if stop <= start:
            return start, start
        lo = start // size * size
        last = stop // size
        rows = min(size, total - last * size)
        if stop == total or stop % size == 0 or stop - last * size == min(self._halo, rows):
            return lo, stop
        return lo, min(total, (last + 1) * size)

    def _check(self, rows: np.ndarray, lo: int) -> None:
        """Every block (or trailing head) in ``rows`` (from block-aligned row
        ``lo``), over the usable cores (the digests leave the interpreter lock)."""
        size, table = self.block_rows, self.table
        data = np.ascontiguousarray(rows, dtype=self._setup.rows.dtype)

        def check(k: int) -> None:
            block, part = lo // size + k, data[k * size:(k + 1) * size]
            whole = len(part) == min(size, self._setup.rows.total_rows - block * size)
            full_seed, head_seed = _seeds(self._base, block)
            found = xxhash.xxh3_64_intdigest(part.data, full_seed if whole else head_seed)
            if found != int(table[block, 0 if whole else 1]):
                self._mismatch(block, block * size, block * size + len(part), whole)

        in_threads(check, -(-len(data) // size), least=CHECKS_PER_THREAD)

    def _mismatch(self, block: int, start: int, stop: int, whole: bool) -> None:
        ask_guard(self._setup)  # a replaced store says so, never "corrupt"
        where = self._describe(block) if self._describe else str(self._path.parent)
        what = "rows" if whole else "first rows"
        raise StoreError(f"{where}: block {block} (rows {start}..{stop}): its decoded "
                         f"{what} do not match the digest written with the store in "
                         f"{self._path} (a file was changed, or belongs to another store "
                         "or place)")

    def read_rows(self, start: int, stop: int) -> np.ndarray:
        if not _CHECKS:
            return np.asarray(self.inner.read_rows(start, stop))
        lo, hi = self._widen(start, stop)
        rows = np.asarray(self.inner.read_rows(lo, hi))
        return self._checked(rows, lo, hi, start, stop)

    def _checked(self, rows: np.ndarray, lo: int, hi: int, start: int, stop: int
                 ) -> np.ndarray:
        if len(rows) != hi - lo:
            raise StoreError(f"{self._path.parent}: rows {lo}..{hi}: read {len(rows)} rows")
        self._check(rows, lo)
        out = rows[start - lo:stop - lo]
        return out if out.flags.c_contiguous else np.ascontiguousarray(out)

    def read_many(self, ranges: Sequence[tuple[int, int]]) -> list[np.ndarray]:
        if not self.fetches_together:
            return super().read_many(ranges)
        if not _CHECKS:
            return list(self.inner.read_many(ranges))
        wide = [self._widen(a, b) for a, b in ranges]
        parts = self.inner.read_many(wide)
        return [self._checked(np.asarray(rows), lo, hi, a, b)
                for rows, (lo, hi), (a, b) in zip(parts, wide, ranges, strict=True)]


def checked(inner: RowReader, data_dir: Path, data: dict[str, Any], setup: ReaderSetup,
            describe: Describe | None = None) -> CheckedReader:
    """``inner`` with every block it reads checked (see :class:`CheckedReader`)."""
    return CheckedReader(inner, data_dir.parent / data["digests"], setup, describe)
