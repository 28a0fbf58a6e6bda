"""TensorFlow's C++ start-up lines kept off stderr, unless the user asked for them.

Loading TensorFlow prints lines such as ``oneDNN custom operations are on``,
``Could not find cuda drivers on your machine`` and, at the first device,
``failed call to cuInit``. They are noise to a windowkit user: TensorFlow's real
errors reach Python as exceptions. When the user has not set
``TF_CPP_MIN_LOG_LEVEL``, importing windowkit

- sets it to ``3`` (what silences the later lines, ``cuInit`` among them), and
- while ``tensorflow`` is first imported (by windowkit, Keras or the user), sends
  the process's stderr (file descriptor 2) to a temporary file, then writes back
  every line but TensorFlow's log lines below ``FATAL``: the lines printed while
  the libraries load come before TensorFlow reads its log level, so no
  environment variable silences them (TensorFlow 2.16 and later).

A ``TF_CPP_MIN_LOG_LEVEL`` the user set is left as it is, and honoured for those
early lines too: at ``1`` the info lines (``oneDNN custom operations are on``,
``Could not find cuda drivers``) are dropped, at ``2`` the warnings as well, at
``3`` the errors as well; at ``0`` nothing is filtered.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

LEVEL = "TF_CPP_MIN_LOG_LEVEL"
#: set beside ``LEVEL`` when windowkit chose it, so that worker processes
#: (which inherit the environment) know it is not the user's
MARK = "WINDOWKIT_TF_LOG_LEVEL_DEFAULT"
DEFAULT = "3"

SEVERITIES = "IWE"  # absl/TSL's log severities below FATAL, by level 0, 1, 2


def noise(hidden: str = SEVERITIES) -> re.Pattern[bytes]:
    """absl/TSL log lines of the ``hidden`` severities (``I0000 00:00:1700000000.1
    123 port.cc:153] ...``), absl's notice before its set-up, and the
    CPU-feature notice's second line (an info line's)."""
    notices = [rb"WARNING: All log messages before absl::InitializeLog\(\) is called"]
    if "I" in hidden:
        notices.append(rb"To enable the following instructions: .*rebuild TensorFlow")
    return re.compile(b"|".join([b"[" + hidden.encode() + rb"]\d{4} [\d:.]+\s+\d+ \S+:\d+\] ",
                                 *notices]))


#: what is dropped when windowkit chose the log level
NOISE = noise()


def quiet_tensorflow() -> None:
    """Keep TensorFlow's start-up lines off stderr; those below the log level the
    user set, if any."""
    level = os.environ.get(LEVEL)
    if level is None or (os.environ.get(MARK) == "1" and level == DEFAULT):
        os.environ[LEVEL] = DEFAULT
        os.environ[MARK] = "1"
        hidden = SEVERITIES
    else:  # the user's choice: TensorFlow hides what is below it, but not at start-up
        hidden = SEVERITIES[:_number(level)]
    if hidden and "tensorflow" not in sys.modules and not any(
            isinstance(f, _QuietFirstImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _QuietFirstImport(hidden))


def _number(level: str) -> int:
    """A log level as TensorFlow reads it (anything else: 0, everything shown)."""
    try:
        return max(0, int(level.strip()))
    except ValueError:
        return 0


class _QuietFirstImport:
    """A meta path finder that wraps the first import of ``tensorflow`` in
    :func:`filtered_stderr`, then removes itself."""

    def __init__(self, hidden: str = SEVERITIES) -> None:
        self._finding = False
        self._hidden = hidden

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname != "tensorflow" or self._finding:
            return None
        self._finding = True
        try:
            spec = importlib.util.find_spec(fullname)  # by the other finders
        finally:
            self._finding = False
        loader: Any = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            with contextlib.suppress(ValueError):
                sys.meta_path.remove(self)  # the import happens: once is enough
            try:
                with filtered_stderr(self._hidden):
                    original(module)
            finally:
                with contextlib.suppress(AttributeError):
                    del loader.exec_module

        with contextlib.suppress(AttributeError, TypeError):  # a loader taking no attributes
            loader.exec_module = exec_module
        return spec


@contextlib.contextmanager
def filtered_stderr(hidden: str = SEVERITIES) -> Iterator[None]:
    """While inside, file descriptor 2 goes to a temporary file; afterwards its
    lines are written to the real stderr, but for TensorFlow's log lines of the
    ``hidden`` severities (:func:`noise`)."""
    dropped = noise(hidden)
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no stderr: nothing to keep clean
        saved = -1
    if saved < 0:
        yield
        return
    with tempfile.TemporaryFile() as captured:
        try:
            os.dup2(captured.fileno(), 2)
            yield
        finally:
            with contextlib.suppress(Exception):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().splitlines(keepends=True)
                    if not dropped.match(line)]
            if kept:
                os.write(2, b"".join(kept))


quiet_tensorflow()
