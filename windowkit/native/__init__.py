"""windowkit's compiled TensorFlow ops, what every ``tf.data`` reader cuts
its batches with (the ``*.cc`` files beside this one):

- :func:`window_copy`: ``tf.gather`` of a batch's window rows costs about
  twice NumPy's copy of the same windows (its work is per row, 64 bytes for
  16 float32 columns); the op copies each window in one ``memcpy``;
- :func:`epoch_starts`: where a chunk of a shuffled epoch's windows start in
  the held rows (the keyed permutation, the index's runs, the held blocks),
  in one pass where the graph took about 50 ops.

They are compiled once per TensorFlow install with the C++ compiler
TensorFlow's own flags name (``tf.sysconfig``), by ``make install`` or at
their first use, into a cache (``$WINDOWKIT_CACHE/ops``, else
``~/.cache/windowkit/ops``), and loaded from there. Where they cannot be
built (no compiler: ``CXX`` names one) or ``WINDOWKIT_NATIVE=0``, the
readers do the same in TensorFlow's own ops, said once in the log.
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

SOURCES = sorted(Path(__file__).parent.glob("*.cc"))
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

    return [compiler, "-shared", "-fPIC", "-O2", "-w", *map(str, SOURCES), "-o", str(target),
            *tf.sysconfig.get_compile_flags(), *tf.sysconfig.get_link_flags()]


def library_path(compiler: str) -> Path:
    """The built ops' path for these sources, TensorFlow and compiler."""
    import tensorflow as tf

    key = hashlib.sha256(b"\0".join([
        *(source.read_bytes() for source in SOURCES), tf.__version__.encode(),
        tf.sysconfig.get_lib().encode(), compiler.encode(), sys.platform.encode()]
    )).hexdigest()[:16]
    return cache_dir() / f"ops-{key}.so"


class BuildError(RuntimeError):
    """The ops could not be compiled (the compiler's own words)."""


def build(compiler: str | None = None) -> Path:
    """The ops' shared library, compiled now unless these sources, TensorFlow
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
    """The loaded ops' module, or None (said once) where it cannot be had."""
    if os.environ.get("WINDOWKIT_NATIVE", "1") == "0":
        return None
    import tensorflow as tf

    try:
        compiler = _compiler()
        path = library_path(compiler) if compiler else None
        if path is None or not path.exists():
            _log.info("compiling windowkit's ops for TensorFlow %s (once)",
                      tf.__version__)
            path = build(compiler)
        return tf.load_op_library(str(path))
    except (BuildError, OSError, tf.errors.OpError) as error:
        _log.warning("tf.data readers cut windows with TensorFlow's own ops (about "
                     "1.5x the CPU per window): windowkit's compiled ops are not available: %s",
                     error)
        return None


def available() -> bool:
    """Whether the compiled ops run (building them if needed)."""
    return _library() is not None


def window_copy(rows: tf.Tensor, starts: tf.Tensor, length: int, step: int = 1, *,
                compiled: bool = True) -> tf.Tensor:
    """``windows[i, k] = rows[starts[i] + k * step]`` for ``k < length``:
    ``[len(starts), length, *rows.shape[1:]]``, each window copied whole
    (``tf.gather`` where the op is not available, or with ``compiled=False``:
    for graphs run where the op is not loaded); a start whose window leaves
    the rows is an ``InvalidArgumentError``."""
    import tensorflow as tf

    library = _library() if compiled else None
    starts = tf.cast(starts, tf.int64)
    if library is None:
        offsets = tf.range(length, dtype=tf.int64) * step
        return tf.gather(rows, starts[:, None] + offsets[None])
    return library.windowkit_window_copy(rows, starts, length=length, step=step)


def epoch_starts(lo: tf.Tensor, hi: tf.Tensor, key: tf.Tensor, *, size: int,
                 run_first: tf.Tensor, run_start: tf.Tensor, run_series: tf.Tensor,
                 stride: int, block_base: tf.Tensor, block_rows: int
                 ) -> tuple[tf.Tensor, tf.Tensor] | None:
    """Where the windows at positions ``[lo, hi)`` of the epoch permutation
    keyed ``key`` (a uint64 scalar) over ``size`` windows start in the held
    rows, and their series (int32); None where the op is not available.

    The windows are runs of the index (run ``r``'s first window is number
    ``run_first[r]``, starts at global row ``run_start[r]``, in series
    ``run_series[r]``; its windows ``stride`` rows apart); the held rows are
    blocks of ``block_rows`` rows, block ``b``'s first at ``block_base[b]``.
    """
    library = _library()
    if library is None:
        return None
    return library.windowkit_epoch_starts(
        lo, hi, size, key, run_first, run_start, run_series, block_base,
        stride=stride, block_rows=block_rows)


def main() -> None:
    """``python -m windowkit.native``: build the ops now (``make install``)."""
    try:
        path = build()
    except BuildError as error:
        print(f"windowkit: the compiled ops were not built: {error}; tf.data readers "
              "will use TensorFlow's own", file=sys.stderr)
        return
    print(f"windowkit: compiled ops at {path}")
