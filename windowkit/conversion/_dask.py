"""Part tasks on a Dask cluster (``convert --dask ADDRESS``).

Each part is one task: a worker reads the part's source rows and writes its
data files straight to the target: uploaded into the workspace prefix for a
URL target, or into the workspace directory for a path (a file system the
workers share with the client). Tasks are idempotent (a part's files are
rewritten whole, with the same bytes), so Dask may retry them. The client
records each part as its task finishes and writes the tables and the
manifest after the last one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from windowkit.errors import InvalidSpecError

CONNECT_TIMEOUT = "10s"  # a scheduler that does not answer by then is an error
RETRIES = 2  # per task: a worker lost mid-part is retried elsewhere


@contextmanager
def dask_client(dask: Any) -> Iterator[Any]:
    """A ``distributed.Client``: the one given, or one connected to the
    scheduler address given (closed afterwards)."""
    try:
        from distributed import Client
    except ImportError:
        raise InvalidSpecError("--dask needs Dask: pip install 'windowkit[dask]'") from None
    if isinstance(dask, Client):
        yield dask
        return
    address = str(dask)
    try:
        client = Client(address, timeout=CONNECT_TIMEOUT, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as exc:
        raise InvalidSpecError(f"--dask {address}: no Dask scheduler answers there "
                               f"({type(exc).__name__}: {str(exc).splitlines()[0]})") from None
    try:
        yield client
    finally:
        client.close()


def run_on_dask(client: Any, write: Callable[..., Any], tasks: list[tuple[int, tuple[Any, ...]]],
                on_done: Callable[[int, Any], None]) -> None:
    """Run ``write(*args)`` for each ``(number, args)`` on the cluster, calling
    ``on_done(number, result)`` as each task finishes (the first failure
    cancels the rest and raises)."""
    from distributed import as_completed

    futures = {client.submit(write, *args, key=f"windowkit-part-{number}-{id(tasks)}",
                             retries=RETRIES, pure=False): number for number, args in tasks}
    try:
        for future in as_completed(list(futures), loop=client.loop):
            on_done(futures[future], future.result())
    except BaseException:
        client.cancel(list(futures))
        raise
