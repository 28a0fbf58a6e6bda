"""What every command shares: one-line errors, and sizes as options."""

from __future__ import annotations

import contextlib
import errno
import functools
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import click

from windowkit.errors import Interrupted, WindowkitError, carried_error


def one_line_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except WindowkitError as exc:
            click.echo(f"windowkit: error: {exc}", err=True)
            sys.exit(2)
        except Interrupted as exc:
            click.echo(f"windowkit: error: {exc}", err=True)
            sys.exit(exc.exit_code)
        except OSError as exc:
            click.echo(f"windowkit: error: {describe_os_error(exc)}", err=True)
            sys.exit(2)
        except Exception as exc:  # a tf.data pipeline's error: the windowkit error inside
            carried = carried_error(exc)
            if carried is None:
                raise
            click.echo(f"windowkit: error: {carried}", err=True)
            sys.exit(2)

    return wrapper


def describe_os_error(exc: OSError) -> str:
    """One line for an operating-system error: the file, then what went wrong."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
        reason += " (make room, or raise the file size limit, and run the same command again)"
    return f"{exc.filename}: {reason}" if exc.filename else reason


@contextlib.contextmanager
def signals_interrupt(what: str, hint: str) -> Iterator[None]:
    """While inside, SIGINT and SIGTERM raise :class:`Interrupted` (once: a second
    signal does not interrupt the clean-up), saying ``what`` was interrupted and
    ``hint``; the handlers are restored afterwards. Only in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught = {signal.SIGINT: signal.getsignal(signal.SIGINT),
              signal.SIGTERM: signal.getsignal(signal.SIGTERM)}

    def interrupt(signum: int, frame: FrameType | None) -> None:
        for number in caught:
            signal.signal(number, signal.SIG_IGN)
        name = signal.Signals(signum).name
        raise Interrupted(f"{what} interrupted ({name}); {hint}", signum)

    for number in caught:
        signal.signal(number, interrupt)
    try:
        yield
    finally:
        for number, handler in caught.items():
            signal.signal(number, handler)


class ByteSize(click.ParamType):
    """A size such as ``64MiB``, ``1GB`` or ``1048576`` (bytes), parsed by pydantic."""

    name = "size"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> int:
        from pydantic import ByteSize as Size
        from pydantic import TypeAdapter, ValidationError

        try:
            size = int(TypeAdapter(Size).validate_python(value))
        except ValidationError:
            self.fail(f"{value!r} is not a size (examples: 64MiB, 1GB, 1048576)", param, ctx)
        if size < 1:
            self.fail(f"{value!r} is not a positive size", param, ctx)
        return size


_NO_ARGS_IS_HELP: Any = getattr(click.exceptions, "NoArgsIsHelpError", ())


class OneLineUsageErrors(click.Group):
    """Usage mistakes (a missing option, a bad choice) are one line too."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.pop("standalone_mode", None)
        try:
            code = super().main(*args, standalone_mode=False, **kwargs)  # type: ignore[call-overload]
        except _NO_ARGS_IS_HELP as exc:  # bare `windowkit`: the help, as usual
            exc.show()
            sys.exit(exc.exit_code)
        except click.ClickException as exc:  # click words some on many lines (choices)
            message = " ".join(exc.format_message().split())
            click.echo(f"windowkit: error: {message}", err=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("windowkit: aborted", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)
