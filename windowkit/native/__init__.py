"""windowkit's compiled TensorFlow op: the window copy every ``tf.data``
reader cuts its batches with (``window_copy.cc`` beside this file).

``tf.gather`` of a batch's window rows costs about twice NumPy's copy of the
same windows (its work is per row, 64 bytes for 16 float32 columns); the op
copies each window in one ``memcpy``. It is compiled once per TensorFlow
install with the C++ compiler TensorFlow's own flags name
(``tf.sysconfig``), by ``make install`` or at its first use, into a cache
(``$WINDOWKIT_CACHE/ops``, else ``~/.cache/windowkit/ops``), and loaded
from there. Where it cannot be built (no compiler: ``CXX`` names one) or
``WINDOWKIT_NATIVE=0``, :func:`window_copy` is the same ``tf.gather``, said
once in the log.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import tensorflow as tf

SOURCE = Path(__file__).with_name("window_copy.cc")
_log = logging.getLogger("windowkit")


def cache_dir() -> Path:
    """Where built ops are kept: ``$WINDOWKIT_CACHE`` or ``~/.cache/windowkit``
    (as a remote conversion's mirror), ``ops/``."""
    return Path(os.environ.get("WINDOWKIT_CACHE") or Path.home() / ".cache" / "windowkit") / "ops"


def _compiler() -> str | None:
    """The C++ compiler: ``CXX``, else ``c++``/``g++``/``clang++`` on the path."""
    named = os.environ.get("CXX")
    if named:
        return shutil.which(named)
    return next(filter(None, map(shutil.which, ("c++", "g++", "clang++"))), None)


def _command(compiler: str, target: Path) -> list[str]:
    import tensorflow as tf

    return [compiler, "-shared", "-fPIC", "-O2", "-w", str(SOURCE), "-o", str(target),
            *tf.sysconfig.get_compile_flags(), *tf.sysconfig.get_link_flags()]


def library_path(compiler: str) -> Path:
    """The built op's path for this source, TensorFlow and compiler."""
    import tensorflow as tf

    key = hashlib.sha256(b"\0".join([
        SOURCE.read_bytes(), tf.__version__.encode(), tf.sysconfig.get_lib().encode(),
        compiler.encode(), sys.platform.encode()])).hexdigest()[:16]
    return cache_dir() / f"window_copy-{key}.so"


class BuildError(RuntimeError):
    """The op could not be compiled (the compiler's own words)."""


def build(compiler: str | None = None) -> Path:
    """The op's shared library, compiled now unless this source, TensorFlow
    and compiler already have one (written under a temporary name, then
    renamed: processes building at once never load half a file)."""
    compiler = compiler or _compiler()
    if compiler is None:
        raise BuildError("no C++ compiler found (set CXX to one)")
    target = library_path(compiler)
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as work:
        built = Path(work) / target.name
        done = subprocess.run(_command(compiler, built), capture_output=True, text=True,
                              check=False)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["(nothing said)"])[-1]
            raise BuildError(f"{compiler} failed ({done.returncode}): {last}")
        os.replace(built, target)
    return target


@functools.cache
def _library() -> Any | None:
    """The loaded op module, or None (said once) where it cannot be had."""
    if os.environ.get("WINDOWKIT_NATIVE", "1") == "0":
        return None
    import tensorflow as tf

    try:
        compiler = _compiler()
        path = library_path(compiler) if compiler else None
        if path is None or not path.exists():
            _log.info("compiling the window copy op for TensorFlow %s (once)",
                      tf.__version__)
            path = build(compiler)
        return tf.load_op_library(str(path))
    except (BuildError, OSError, tf.errors.OpError) as error:
        _log.warning("tf.data readers copy windows with tf.gather (about twice "
                     "the CPU per window): the compiled window copy is not available: %s",
                     error)
        return None


def available() -> bool:
    """Whether :func:`window_copy` runs the compiled op (building it if needed)."""
    return _library() is not None


def window_copy(rows: tf.Tensor, starts: tf.Tensor, length: int, step: int = 1) -> tf.Tensor:
    """``windows[i, k] = rows[starts[i] + k * step]`` for ``k < length``:
    ``[len(starts), length, *rows.shape[1:]]``, each window copied whole
    (``tf.gather`` where the op is not available); a start whose window
    leaves the rows is an ``InvalidArgumentError``."""
    import tensorflow as tf

    library = _library()
    starts = tf.cast(starts, tf.int64)
    if library is None:
        offsets = tf.range(length, dtype=tf.int64) * step
        return tf.gather(rows, starts[:, None] + offsets[None])
    return library.windowkit_window_copy(rows, starts, length=length, step=step)


def main() -> None:
    """``python -m windowkit.native``: build the op now (``make install``)."""
    try:
        path = build()
    except BuildError as error:
        print(f"windowkit: the compiled window copy was not built: {error}; tf.data readers "
              "will use tf.gather", file=sys.stderr)
        return
    print(f"windowkit: window copy op at {path}")
