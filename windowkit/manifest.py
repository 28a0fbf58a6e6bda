"""The store manifest ``windowkit.json``: written last, read first (DESIGN §2)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from windowkit.errors import StoreError
from windowkit.spec import WindowSpec

MANIFEST_NAME = "windowkit.json"
FORMAT_VERSION = 1
CHECKSUM = "sha256"


_READ_BYTES = 1 << 20


def file_digest(path: Path, on_bytes: Callable[[int], object] | None = None) -> str:
    """The file's checksum (hex), read in 1 MiB pieces; ``on_bytes`` sees each size."""
    digest = hashlib.new(CHECKSUM)
    with open(path, "rb") as fh:
        while chunk := fh.read(_READ_BYTES):
            digest.update(chunk)
            if on_bytes is not None:
                on_bytes(len(chunk))
    return digest.hexdigest()


@dataclass(frozen=True)
class FileEntry:
    """One file of the store, relative to the store root."""

    path: str
    bytes: int
    sha256: str

    @classmethod
    def of(cls, root: Path, relative: str) -> FileEntry:
        full = root / relative
        return cls(relative, full.stat().st_size, file_digest(full))


@dataclass(frozen=True)
class Manifest:
    """Everything a reader needs to know about a store."""

    format: str
    dtype: str
    step_shape: tuple[int, ...]
    columns: list[str] | None
    window: WindowSpec
    total_rows: int
    block_rows: int
    splits: dict[str, dict[str, Any]]
    series: dict[str, Any]
    data: dict[str, Any]
    normalization: dict[str, Any] | None
    options: dict[str, Any]
    source_fingerprint: str
    files: list[FileEntry] = field(default_factory=list)
    target_columns: list[str] | None = None  # y holds only these columns (DESIGN §1)
    format_version: int = FORMAT_VERSION

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["window"] = self.window.to_dict()
        out["step_shape"] = list(self.step_shape)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        data = dict(data)
        version = data.get("format_version")
        if version != FORMAT_VERSION:
            raise StoreError(
                f"store format version {version!r} is not supported (expected {FORMAT_VERSION})"
            )
        data["window"] = WindowSpec.from_dict(data["window"])
        data["step_shape"] = tuple(data["step_shape"])
        data["files"] = [FileEntry(**f) for f in data.get("files", [])]
        return cls(**data)

    def write(self, root: Path) -> None:
        """Write the manifest durably (temporary file, fsync, rename)."""
        target = root / MANIFEST_NAME
        tmp = root / (MANIFEST_NAME + ".tmp")
        with open(tmp, "w") as fh:
            json.dump(self.to_dict(), fh, indent=2, sort_keys=True)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)

    @classmethod
    def read(cls, root: Path) -> Manifest:
        path = root / MANIFEST_NAME
        if not root.exists():
            raise StoreError(f"{root}: no such store")
        if not path.exists():
            raise StoreError(f"{root}: not a windowkit store (no {MANIFEST_NAME})")
        try:
            with open(path) as fh:
                return cls.from_dict(json.load(fh))
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise StoreError(f"{path}: manifest is unreadable ({exc})") from None
