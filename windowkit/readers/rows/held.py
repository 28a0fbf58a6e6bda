"""Uniform shuffling by random access: every window of a split, any order.

:class:`HeldRows` holds, once, the rows a split's windows need: the storage
blocks where they start, each followed by its halo (runs of neighbouring
blocks share their rows). They are read block group by block group through
the format's checked row reader, into memory when they fit the memory budget,
else into a private file on local disk (opened unlinked, so no path reaches
it; see :func:`spill_directory`), memory-mapped and left to the page cache:
the mapping is kept, so a warm epoch reads at memory speed, and what it maps
is page cache (the process's file-backed pages, which the kernel takes back
whenever it needs them), not the process's own (anonymous) memory. Read cold
(not in the page cache), a gather first asks for all its windows' pages at once
(:class:`SpillPrefetch`), so that the disk reads them many at a time rather than
one page fault after another.
A batch is then one NumPy fancy index over a strided view of those rows (a
copy of ``B`` contiguous row ranges that releases the interpreter lock), with
no Python per window.

:class:`UniformOrder` says which windows a batch holds: batch ``b`` of an
epoch holds the windows at epoch positions ``b*B .. b*B+B-1`` of a keyed
bijection of the split's windows (:mod:`windowkit.readers.epoch.permutation`), a new key
each epoch; nothing is materialized, and an iterator's position is all its
state. Sharded, a shard holds only the rows of its own windows, and its epoch
is the split's permutation restricted to them
(:class:`windowkit.readers.epoch.batches.EpochBatches` puts the two
together for every reader).
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import psutil

from windowkit._progress import human_size
from windowkit.errors import DiskSpaceError, InvalidSpecError, WindowkitError
from windowkit.index import WindowRuns
from windowkit.readers.epoch.permutation import KeyedPermutations
from windowkit.readers.epoch.sampler import uniform_key
from windowkit.readers.plan import ReadPlan
from windowkit.readers.windows import cut_from_views, window_views

SPILL_DIR_ENV = "WINDOWKIT_SPILL_DIR"
LOAD_BYTES = 16 << 20  # rows read at once while loading (two such reads in flight)
#: a spill is written in pieces this small, so that the page cache holds it in
#: small folios: a window read then maps about a fault-around's worth of it
#: (a large folio, written at once, is mapped whole: up to megabytes a window)
WRITE_PIECE = 64 << 10
#: pages of a gather from a spill checked for residency (all in the page cache:
#: its pages are not asked for ahead, see :class:`SpillPrefetch`)
RESIDENCY_SAMPLE = 16
#: gathers left unchecked at most after a run of resident checks (the gap doubles
#: with each, from 1): a warm spill is checked once in this many gathers
RESIDENCY_SKIP = 64
PAGE = mmap.PAGESIZE
ALIGN_BYTES = 64  # TensorFlow reads an array without a copy from this alignment
ORDER_SPAN = 16384  # epoch positions whose windows a uniform order permutes at once


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype[Any] | str) -> np.ndarray:
    """An uninitialised array whose data starts on a 64-byte boundary: what
    TensorFlow needs to read it where it is, without a copy."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    buffer = np.empty(nbytes + ALIGN_BYTES, dtype=np.uint8)
    skip = -buffer.ctypes.data % ALIGN_BYTES
    return buffer[skip:skip + nbytes].view(dtype).reshape(shape)


def spill_directory(spill_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where rows beyond the memory budget go: ``spill_dir``, else
    ``$WINDOWKIT_SPILL_DIR``, else the system's temporary directory unless it
    is held in memory (tmpfs), then ``~/.cache/windowkit``."""
    chosen = spill_dir if spill_dir is not None else os.environ.get(SPILL_DIR_ENV)
    if chosen:
        path = Path(chosen).expanduser()
        if not path.is_dir():
            raise InvalidSpecError(f"spill_dir {str(path)!r} is not a directory")
        return path
    temp = Path(tempfile.gettempdir())
    if _filesystem_type(temp) not in ("tmpfs", "ramfs"):
        return temp
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "windowkit"
    cache.mkdir(parents=True, exist_ok=True)
    return cache


def _filesystem_type(path: Path) -> str:
    """The type of the file system holding ``path`` (its longest mount point)."""
    resolved, best, kind = str(path.resolve()), "", ""
    for part in psutil.disk_partitions(all=True):
        mount = part.mountpoint.rstrip("/") + "/"
        if (resolved + "/").startswith(mount) and len(mount) > len(best):
            best, kind = mount, part.fstype
    return kind


@dataclass(frozen=True)
class HeldPlacement:
    """Where the rows of a plan's blocks go in the held rows.

    ``loads`` are the reads, each a run of blocks (ascending) read with one
    call, whose rows land at ``[base, base + rows)``; ``block_base[b]`` is
    where block ``b``'s first row lands (-1: not held)."""

    loads: list[tuple[np.ndarray, int, int]]  # (blocks, base, rows)
    block_base: np.ndarray
    total_rows: int

    @classmethod
    def of(cls, plan: ReadPlan) -> HeldPlacement:
        size, halo = plan.layout.block_rows, plan.spec.span - 1
        blocks = np.flatnonzero(plan.windows_per_block()).astype(np.int64)
        per_load = max(1, LOAD_BYTES // max(1, (size + halo) * plan.layout.row_bytes))
        loads: list[tuple[np.ndarray, int, int]] = []
        base = 0
        for lo in range(0, len(blocks), per_load):
            part = blocks[lo:lo + per_load]
            breaks = np.flatnonzero(np.diff(part) != 1) + 1
            firsts = part[np.concatenate([[0], breaks])]
            lasts = part[np.concatenate([breaks - 1, [len(part) - 1]])]
            rows = int(np.sum(np.minimum(plan.layout.total_rows, (lasts + 1) * size + halo)
                              - firsts * size))
            loads.append((part, base, rows))
            base += rows
        return cls(loads, np.full(plan.layout.num_blocks, -1, dtype=np.int64), base)


class HeldRows:
    """The rows of a split's windows, held once: in memory, or spilled to a
    private memory-mapped file. ``windows(starts)`` cuts a batch."""

    def __init__(self, plan: ReadPlan, *, memory_budget: int,
                 spill_dir: str | os.PathLike[str] | None = None) -> None:
        placement = HeldPlacement.of(plan)
        self.block_rows = plan.layout.block_rows
        self.block_base = placement.block_base
        self.nbytes = placement.total_rows * plan.layout.row_bytes
        self.spilled = self.nbytes > memory_budget
        self._file: IO[bytes] | None = None
        self._map: mmap.mmap | None = None
        shape = (placement.total_rows, *plan.layout.step_shape)
        if self.spilled:
            directory = spill_directory(spill_dir)
            self._file, self._map = _spill(plan, placement, self.nbytes, directory)
            rows = np.frombuffer(self._map, dtype=plan.layout.dtype,
                                 count=placement.total_rows * plan.layout.cells
                                 ).reshape(shape)
        else:
            rows = aligned_empty(shape, plan.layout.dtype)

            def put(base: int, part: np.ndarray) -> None:
                rows[base:base + len(part)] = part

            _load(plan, placement, put)
        self.rows = rows
        self._views = window_views(rows, plan.spec)
        self._prefetch: SpillPrefetch | None = None
        if self._file is not None:
            self._prefetch = SpillPrefetch(
                self._file.fileno(), rows, row_bytes=plan.layout.row_bytes,
                span=plan.spec.span, errors=(directory, self.nbytes))

    @property
    def prefetch(self) -> SpillPrefetch | None:
        """What asks for a spill's pages ahead of a gather (None: held in memory)."""
        return self._prefetch

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError("HeldRows holds a split's rows and does not pickle; pickle the plan")

    def windows(self, starts: np.ndarray, targets: np.ndarray | None = None
                ) -> tuple[np.ndarray, np.ndarray | None]:
        """``(x, horizon)`` of the windows starting at global rows ``starts``."""
        return cut_from_views(self._views, self.positions(starts), targets)

    def positions(self, starts: np.ndarray) -> np.ndarray:
        """Where the windows starting at global rows ``starts`` start in
        :attr:`rows` (a spill's pages read ahead first, when not resident)."""
        block = starts // self.block_rows
        at = self.block_base[block] + (starts - block * self.block_rows)
        if self._prefetch is not None:
            self._prefetch(at)
        return at

    def window(self, start: int, targets: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray | None]:
        """``(x, horizon)`` of the one window starting at global row ``start``
        (copies; no array arithmetic, for callers that ask window by window)."""
        block = start // self.block_rows
        at = int(self.block_base[block]) + start - block * self.block_rows
        inputs, horizons = self._views
        x = np.array(inputs[at])
        if horizons is None:
            return x, None
        horizon = horizons[at]
        return x, np.array(horizon if targets is None else horizon[:, targets])

    def evict(self) -> None:
        """Drop a spill from the page cache too (the next epoch reads it from
        disk: what ``bench`` measures as cold)."""
        if self._file is not None and self._map is not None:
            if self._prefetch is not None:
                self._prefetch.reset()
            self._map.madvise(mmap.MADV_DONTNEED)
            os.fsync(self._file.fileno())  # dirty pages stay cached: write them first
            os.posix_fadvise(self._file.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


class SpillPrefetch:
    """Asks the kernel for the pages of a gather's windows all at once when the
    spill is not in the page cache (a cold epoch), so that the disk reads them
    many at a time: one by one, each window would wait on its own page fault,
    at the disk's one-read-at-a-time rate.

    A gather first checks a few of its pages (``mincore``, :data:`RESIDENCY_SAMPLE`
    calls); all resident, nothing more is done (a warm epoch), and the next
    1, 2, 4 .. :data:`RESIDENCY_SKIP` gathers are not even checked (the checks
    cost a few microseconds; :meth:`HeldRows.evict` starts over). Else its windows'
    rows become runs of pages (merged with NumPy), each handed to
    ``posix_fadvise(POSIX_FADV_WILLNEED)``, which starts reading it and returns
    (pages already cached cost a look-up): the gather's faults then wait on
    reads already in flight. An OS error is the spill's one line. ``mode`` is
    ``"auto"``, ``"always"`` or ``"never"`` (tests)."""

    def __init__(self, fd: int, rows: np.ndarray, *, row_bytes: int, span: int,
                 errors: tuple[Path, int]) -> None:
        self.fd, self.row_bytes, self.span = fd, row_bytes, span
        self.address = int(rows.__array_interface__["data"][0])
        self.pages = -(-max(1, rows.nbytes) // PAGE)
        self.errors = errors  # (spill directory, bytes): what an error names
        self.mode = "auto"
        self.prefetched = 0  # gathers whose pages were asked for ahead (tests)
        self.unchecked = 0  # gathers left to take as resident, unchecked
        self._gap = 0  # gathers left unchecked after the latest resident check

    def __call__(self, at: np.ndarray) -> None:
        """Start reading the pages of the windows at held rows ``at``."""
        if self.mode == "never" or len(at) == 0:
            return
        at = np.asarray(at, dtype=np.int64)
        if self.mode == "auto":
            if self.unchecked > 0:  # (threads may race on the counts: no harm)
                self.unchecked -= 1
                return
            if self._resident(at[::max(1, len(at) // RESIDENCY_SAMPLE)]):
                self._gap = min(RESIDENCY_SKIP, 2 * self._gap or 1)
                self.unchecked = self._gap
                return
            self._gap = 0
        offsets, lengths = self._runs(np.sort(at))
        with _spill_errors(*self.errors):
            for offset, length in zip(offsets.tolist(), lengths.tolist(), strict=True):
                os.posix_fadvise(self.fd, offset, length, os.POSIX_FADV_WILLNEED)
        self.prefetched += 1

    def reset(self) -> None:
        """Check the next gather (the spill was just dropped from the page cache)."""
        self.unchecked = self._gap = 0

    def _resident(self, at: np.ndarray) -> bool:
        """Whether the first page of every window at held rows ``at`` (a few) is
        in the page cache."""
        vec = ctypes.c_ubyte()
        for row in at[:RESIDENCY_SAMPLE].tolist():
            page = self.address + row * self.row_bytes // PAGE * PAGE
            if _MINCORE(page, PAGE, ctypes.byref(vec)) != 0 or not vec.value & 1:
                return False  # not resident (or cannot tell): ask for them
        return True

    def _runs(self, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Byte ``(offsets, lengths)`` of the runs of pages that the windows at
        sorted held rows ``at`` cover, overlapping and adjacent ones merged."""
        first = at * self.row_bytes // PAGE
        end = np.minimum(((at + self.span) * self.row_bytes - 1) // PAGE + 1, self.pages)
        new = np.ones(len(first), dtype=bool)
        new[1:] = first[1:] > end[:-1]  # ends ascend with the starts: runs are groups
        heads = np.flatnonzero(new)
        lo, hi = first[heads], end[np.append(heads[1:] - 1, len(end) - 1)]
        return lo * PAGE, (hi - lo) * PAGE


def _mincore() -> Any:
    """libc's ``mincore(addr, length, vec)``."""
    function = ctypes.CDLL(None, use_errno=True).mincore
    function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    function.restype = ctypes.c_int
    return function


_MINCORE = _mincore()


def _write_small(file: IO[bytes], rows: np.ndarray) -> None:
    """Append ``rows`` (C-contiguous) to ``file`` in WRITE_PIECE writes."""
    data = rows.data.cast("B")
    for at in range(0, len(data), WRITE_PIECE):
        file.write(data[at:at + WRITE_PIECE])


def _spill(plan: ReadPlan, placement: HeldPlacement, nbytes: int,
           directory: Path) -> tuple[IO[bytes], mmap.mmap]:
    """The plan's rows written to a new private file in ``directory`` (unlinked
    at once: no path reaches it; it goes with the process), and its read-only
    map. Writing it fails as one line naming the directory and what to set."""
    free = shutil.disk_usage(directory).free
    if nbytes > free:
        raise InvalidSpecError(
            f"{plan.store.path}: split {plan.split!r} needs {human_size(nbytes)} of rows, more "
            f"than memory_budget, and {directory} has {human_size(free)} free to hold them; "
            f"set spill_dir= (or ${SPILL_DIR_ENV}) to a local disk with room, raise "
            "memory_budget, or use shuffle='blocks'")
    file = _spill_file(directory, nbytes)
    try:
        def put(base: int, part: np.ndarray) -> None:
            with _spill_errors(directory, nbytes):  # not the store's reads: their own errors
                _write_small(file, part)

        _load(plan, placement, put)
        with _spill_errors(directory, nbytes):
            file.flush()
            rows = mmap.mmap(file.fileno(), max(1, nbytes), prot=mmap.PROT_READ)
    except BaseException:
        file.close()
        raise
    rows.madvise(mmap.MADV_RANDOM)  # no read-around: a window is a small read
    return file, rows


def _spill_file(directory: Path, nbytes: int) -> IO[bytes]:
    """A new private file in ``directory``, unlinked at once."""
    with _spill_errors(directory, nbytes):
        return tempfile.TemporaryFile(dir=directory, prefix="windowkit-spill-")


@contextmanager
def _spill_errors(directory: Path, nbytes: int) -> Iterator[None]:
    """An OS error writing the spill (a read-only or full disk, a file size
    limit) as one line naming ``directory`` and what to set instead."""
    try:
        yield
    except WindowkitError:
        raise
    except OSError as exc:
        reason = exc.strerror or str(exc)
        if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            raise DiskSpaceError(
                f"{directory}: {reason} while spilling {human_size(nbytes)} of rows beyond "
                f"memory_budget there; set spill_dir= (or ${SPILL_DIR_ENV}) to a local disk "
                "with room, or raise memory_budget to hold them in memory") from None
        raise InvalidSpecError(
            f"{directory}: cannot spill {human_size(nbytes)} of rows beyond memory_budget "
            f"there ({reason}); set spill_dir= (or ${SPILL_DIR_ENV}) to a writable local "
            "directory, or raise memory_budget to hold them in memory") from None


def _load(plan: ReadPlan, placement: HeldPlacement,
          put: Callable[[int, np.ndarray], object]) -> None:
    """Read every load of ``placement`` in order (the next one read while this one
    is put), record where each block landed, and hand ``put(base, rows)`` the
    rows (C-contiguous)."""
    from windowkit.readers.rows.loader import GroupLoader

    loader = GroupLoader.of(plan)

    def read(load: tuple[np.ndarray, int, int]) -> tuple[np.ndarray, np.ndarray]:
        return loader(load[0])

    with ThreadPoolExecutor(1, thread_name_prefix="windowkit-hold") as pool:
        pending = _ahead(pool, read, placement.loads)
        for (blocks, base, rows_count), (rows, offsets) in zip(placement.loads, pending,
                                                                strict=True):
            if len(rows) != rows_count:
                raise AssertionError(f"load of {len(rows)} rows, expected {rows_count}")
            placement.block_base[blocks] = base + offsets
            put(base, np.ascontiguousarray(rows))


def _ahead(pool: ThreadPoolExecutor, read: Any, loads: list[Any]) -> Iterator[Any]:
    """``read(load)`` of every load in order, the next one read ahead."""
    future = pool.submit(read, loads[0]) if loads else None
    for k in range(len(loads)):
        assert future is not None
        result = future.result()
        future = pool.submit(read, loads[k + 1]) if k + 1 < len(loads) else None
        yield result


class UniformOrder:
    """Every epoch a keyed uniform permutation of the split's windows
    (:func:`windowkit.readers.epoch.sampler.uniform_key`): where epoch position ``p`` of
    epoch ``e`` is, computed directly, nothing materialized."""

    def __init__(self, runs: WindowRuns, *, seed: int) -> None:
        self.runs = runs  # the whole split's windows
        self.seed = seed
        self._cached: tuple[int, KeyedPermutations] | None = None
        self._span: tuple[int, int, np.ndarray] | None = None  # (epoch, first, positions)

    def epoch_key(self, epoch: int) -> int:
        """The permutation key of epoch ``epoch`` (a uint64 as a Python int)."""
        return uniform_key(self.seed, epoch)

    def full(self, epoch: int, where: np.ndarray) -> np.ndarray:
        """Index positions of the split's windows at epoch positions ``where``.
        A run of consecutive positions (a batch, a chunk) is served from a
        span of ``ORDER_SPAN`` positions permuted at once: the permutation's
        cost is per array operation more than per position."""
        n = len(where)
        first = int(where[0]) if n else 0
        if (n and first >= 0 and first + n <= self.runs.total and n <= ORDER_SPAN
                and int(where[-1]) == first + n - 1
                and (n == 1 or bool(np.all(np.diff(where) == 1)))):
            span = self._span
            if span is None or span[0] != epoch or not (
                    span[1] <= first and first + n <= span[1] + len(span[2])):
                hi = min(self.runs.total, first + ORDER_SPAN)
                permuted = self._permuted_at(epoch, np.arange(first, hi, dtype=np.int64))
                permuted.flags.writeable = False  # shared by the batches it serves
                span = (epoch, first, permuted)
                self._span = span
            return span[2][first - span[1]:first - span[1] + n]
        return self._permuted_at(epoch, where)

    def _permuted_at(self, epoch: int, where: np.ndarray) -> np.ndarray:
        return self._permutation(epoch)(where, np.zeros(len(where), dtype=np.int64))

    def _permutation(self, epoch: int) -> KeyedPermutations:
        """The permutation of ``epoch``, built once per epoch (threads share it)."""
        cached = self._cached
        if cached is None or cached[0] != epoch:
            size = np.array([self.runs.total], dtype=np.int64)
            key = np.array([self.epoch_key(epoch)], dtype=np.uint64)
            cached = (epoch, KeyedPermutations(size, key))
            self._cached = cached
        return cached[1]
