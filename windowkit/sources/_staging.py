"""The staging files a table's rows are written to, and the series read back from them.

A table is streamed once; each series' feature values are appended to one raw
little-endian file and its times to another, so the rest of the conversion
reads any series by row range from memory maps, in bounded memory. A
DataFrame has no file to identify it, so a digest of what is staged does.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from windowkit.errors import SourceError


@dataclass
class StagedSeries:
    """One series of a staged table: rows in a raw file, read by memory map."""

    key: str
    where: str
    path: str
    first_row: int  # of this series in the staged file
    rows: int
    dtype: np.dtype
    step_shape: tuple[int, ...]
    source_id: str  # what the rows came from (the table's fingerprint)
    features: tuple[str, ...] = ()
    time_unit: str = ""  # "ns" (timestamps, UTC), "days" (dates), "" (integers)
    time_zone: str | None = None
    first_time: int | None = None
    last_time: int | None = None
    time_step: int | None = None
    segments: list[tuple[int, int]] = field(default_factory=list)  # gap-free row ranges
    times_path: str = ""
    static: tuple[float, ...] = ()  # the series' static column values

    def times(self) -> np.ndarray | None:
        """The series' times (int64, memory-mapped), or None without a time column."""
        if not self.times_path:
            return None
        return np.memmap(self.times_path, dtype="<i8", mode="r", offset=self.first_row * 8,
                         shape=(self.rows,))

    def read(self, start: int, stop: int) -> np.ndarray:
        width = int(np.prod(self.step_shape, dtype=np.int64))
        try:
            rows = np.memmap(self.path, dtype=self.dtype, mode="r",
                             offset=(self.first_row + start) * width * self.dtype.itemsize,
                             shape=(stop - start, *self.step_shape))
        except ValueError as exc:  # the staged file is shorter than the rows asked
            raise SourceError(f"{self.where}: staged rows {start}..{stop} cannot be read "
                              f"({exc})") from exc
        return np.array(rows)


class StagingFiles:
    """The values file and the times file of one staged table, and, for a
    table without a fingerprint, the digest of what is written to them."""

    def __init__(self, staging: Path, digest: bool) -> None:
        self.digest = hashlib.blake2b(digest_size=16) if digest else None
        self.values_path = staging / "rows.bin"
        self.values = open(self.values_path, "wb")  # noqa: SIM115 - closed by close()
        self.times_path = staging / "times.bin"
        self.times = open(self.times_path, "wb")  # noqa: SIM115 - closed by close()

    def start_series(self, key: str) -> None:
        """The rows written next belong to series ``key``."""
        if self.digest is not None:
            self.digest.update(f"\0{key}\0".encode())

    def write(self, values: bytes, times: bytes | None) -> None:
        """Append one run of rows: their values, and their times if there are any."""
        if times is not None:
            self.times.write(times)
        self.values.write(values)
        if self.digest is not None:
            self.digest.update(values)
            if times is not None:
                self.digest.update(times)

    def flush_times(self) -> None:
        """Make the times written so far readable by memory map."""
        self.times.flush()

    def close(self) -> None:
        self.values.close()
        self.times.close()

    def content_id(self, name: str) -> str | None:
        """What identifies table ``name`` by the rows staged (digested), else None."""
        if self.digest is None:
            return None
        return f"{name}:{self.digest.hexdigest()}"
