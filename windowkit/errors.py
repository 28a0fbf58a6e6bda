"""Errors raised by windowkit.

Every user mistake becomes a :class:`WindowkitError` whose message is one line
naming what is wrong and where. Each error also subclasses the matching builtin,
so callers can catch either (``except ValueError`` works for bad input).
"""

from __future__ import annotations


class WindowkitError(Exception):
    """Base class for every error windowkit raises on purpose."""


class InvalidSpecError(WindowkitError, ValueError):
    """A parameter (window length, stride, format, ...) is out of range."""


class SourceError(WindowkitError, ValueError):
    """The input series cannot be read or are not usable as time series."""


class SourceNotFoundError(SourceError, FileNotFoundError):
    """A source path does not exist."""


class StoreError(WindowkitError, OSError):
    """A store is missing, incomplete, corrupt or cannot be written."""


class StoreExistsError(StoreError, FileExistsError):
    """The conversion target exists and may not be replaced."""


class DiskSpaceError(StoreError):
    """The target's file system has too little free space for the store."""


class StoreReplacedError(StoreError):
    """The store was replaced (e.g. by ``convert --overwrite``) while it was read."""


def check_int(name: str, value: object, minimum: int) -> int:
    """``value`` as an int if it is an integer (Python or NumPy, not bool) of at
    least ``minimum``; else one clear error naming ``name``."""
    import numbers

    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise InvalidSpecError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)
