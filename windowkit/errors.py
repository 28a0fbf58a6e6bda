"""Errors raised by windowkit.

Every user mistake becomes a :class:`WindowkitError` whose message is one line
naming what is wrong and where. Each error also subclasses the matching builtin,
so callers can catch either (``except ValueError`` works for bad input).
"""

from __future__ import annotations

import importlib
import numbers
import os
import re
import sys
from types import FrameType

import numpy as np

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes a ``warnings.warn`` in the calling function
    name the first line outside windowkit: the user's."""
    frame: FrameType | None = sys._getframe(1)  # the caller, which warns: level 1
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level


class WindowkitError(Exception):
    """Base class for every error windowkit raises on purpose."""

    def __str__(self) -> str:
        # one line, whatever a wrapped library's message held (pyarrow's span lines)
        text = super().__str__()
        return " ".join(part.strip() for part in text.splitlines() if part.strip()) \
            if "\n" in text else text


class InvalidSpecError(WindowkitError, ValueError):
    """A parameter (window length, stride, format, ...) is out of range."""


class SourceError(WindowkitError, ValueError):
    """The input series cannot be read or are not usable as time series."""


class SourceNotFoundError(SourceError, FileNotFoundError):
    """A source path does not exist."""


class SourceChangedError(SourceError):
    """A source file was rewritten or replaced while it was being converted."""


class OutOfMemoryError(WindowkitError, MemoryError):
    """The machine ran out of memory (or threads, processes) for the work asked."""


class Interrupted(KeyboardInterrupt):
    """A signal (SIGINT, SIGTERM) stopped a command; it exits ``128 + signum``."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class StoreError(WindowkitError, OSError):
    """A store is missing, incomplete, corrupt or cannot be written."""


class NotAStoreError(StoreError, FileNotFoundError):
    """Nothing at the path is a windowkit store (missing, a file, or no manifest)."""


class StoreExistsError(StoreError, FileExistsError):
    """The conversion target exists and may not be replaced."""


class DiskSpaceError(StoreError):
    """The target's file system has too little free space for the store."""


class StoreReplacedError(StoreError):
    """The store was replaced (e.g. by ``convert --overwrite``) while it was read."""


class StoreUnreachableError(StoreError):
    """Object storage did not answer: its endpoint refused the connection, or gave
    no answer within the connect and read timeouts (see ``docs/remote.md``)."""


def check_int(name: str, value: object, minimum: int) -> int:
    """``value`` as an int if it is an integer (Python or NumPy, not bool) of at
    least ``minimum``; else one clear error naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise InvalidSpecError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_bool(name: str, value: object) -> bool:
    """``value`` if it is a bool (Python or NumPy); else one clear error naming ``name``."""
    if not isinstance(value, bool | np.bool_):
        raise InvalidSpecError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def carried_error(exc: BaseException) -> WindowkitError | None:
    """The windowkit error that ``exc`` carries, else None.

    A ``tf.data`` pipeline runs windowkit's Python code (a group read) inside
    TensorFlow, which raises a Python error again as its own ``tf.errors.OpError``
    with the traceback in its message. When the traceback ends in a windowkit
    error, that error (same class, same one-line message) is returned; when it
    ends in anything else (a bug, say), None: it is never relabelled."""
    if isinstance(exc, WindowkitError):
        return exc
    text = str(getattr(exc, "message", exc))
    lines = [line for line in text.splitlines()  # TensorFlow's node lines follow it
             if line.strip() and not line.lstrip().startswith("[[")]
    last = re.fullmatch(r"(windowkit(?:\.\w+)*)\.(\w+): (.+)", lines[-1]) if lines else None
    if last is None and lines:  # a graph assertion's message, as tf.debugging.Assert words it
        last = re.search(r"assertion failed: \[(windowkit(?:\.\w+)*)\.(\w+): (.+?)\]",
                         lines[-1])
    if last is None:
        return None
    module, name, message = last.groups()
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None
    if not (isinstance(cls, type) and issubclass(cls, WindowkitError)):
        return None
    return cls(message)
