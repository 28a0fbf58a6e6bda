"""The ``windowkit`` command line: parses options, calls the library.

Every library error becomes one line on stderr and exit status 2.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

import click

from windowkit.errors import WindowkitError
from windowkit.formats import FORMAT_NAMES


def _one_line_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except WindowkitError as exc:
            click.echo(f"windowkit: error: {exc}", err=True)
            sys.exit(2)
        except OSError as exc:
            click.echo(f"windowkit: error: {exc}", err=True)
            sys.exit(1)

    return wrapper


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


class _OneLineUsageErrors(click.Group):
    """Usage mistakes (a missing option, a bad choice) are one line too."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.pop("standalone_mode", None)
        try:
            code = super().main(*args, standalone_mode=False, **kwargs)  # type: ignore[call-overload]
        except _NO_ARGS_IS_HELP as exc:  # bare `windowkit`: the help, as usual
            exc.show()
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            click.echo(f"windowkit: error: {exc.format_message()}", err=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("windowkit: aborted", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


@click.group(cls=_OneLineUsageErrors,
             context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="windowkit")
def main() -> None:
    """Convert time series into window stores; inspect, verify and benchmark them."""
    # TensorFlow's C++ start-up lines (CUDA probing, CPU features) are noise here;
    # its real errors reach Python as exceptions
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    messages = logging.getLogger("windowkit")  # e.g. "resuming an interrupted conversion"
    if not messages.handlers:
        handler = logging.StreamHandler()  # stderr
        handler.setFormatter(logging.Formatter("windowkit: %(message)s"))
        messages.addHandler(handler)
        messages.setLevel(logging.INFO)


@main.command()
@click.argument("sources", nargs=-1, required=True)
@click.option("--format", "fmt", type=click.Choice(FORMAT_NAMES), required=True,
              help="Storage format of the store.")
@click.option("--out", required=True, type=click.Path(), help="Directory of the new store.")
@click.option("--window", "length", type=int, required=True, help="Window length L (steps).")
@click.option("--stride", type=int, default=1, show_default=True, help="Rows between starts.")
@click.option("--sampling-rate", type=int, default=1, show_default=True,
              help="Rows between the steps of a window.")
@click.option("--horizon", type=int, default=0, show_default=True,
              help="Target steps after the inputs (0: inputs only).")
@click.option("--series-col", default=None,
              help="Table sources: the column naming each row's series (long form).")
@click.option("--time-col", default=None,
              help="Table sources: the time column (integers, dates or timestamps).")
@click.option("--time-format", default=None,
              help="Table sources: the format of a text time column, in strptime codes "
                   "(e.g. %Y/%m/%d, '%d.%m.%Y %H:%M'); ISO times need none.")
@click.option("--columns", default=None,
              help="Table sources: feature columns, comma-separated [default: all others].")
@click.option("--target-columns", default=None,
              help="Columns the targets y hold, comma-separated (needs --horizon) "
                   "[default: all].")
@click.option("--sort-memory", type=ByteSize(), default="1GiB", show_default=True,
              help="Largest long table (its size in memory) whose interleaved series "
                   "are grouped in memory; a larger one is refused.")
@click.option("--max-gap", default=None,
              help="Largest time step a window may span (a number, or 90s, 5min, 1h, 2d) "
                   "[default: 1.5 steps of each series: one missed sample is a gap].")
@click.option("--split", "splits", default=None,
              help="Splits by fraction, e.g. train=0.8,val=0.1,test=0.1 [default: all train].")
@click.option("--split-by", type=click.Choice(["time", "series"]), default="time",
              show_default=True, help="Cut each series in time, or assign whole series "
              "(seeded by --seed).")
@click.option("--split-at", default=None,
              help="Split at points in time instead, e.g. 2020-01-01,2022-01-01 or 2015,2018.")
@click.option("--nan", type=click.Choice(["error", "skip"]), default="error", show_default=True,
              help="NaN, infinite or empty values: refuse them, or keep the rows and leave "
                   "out every window touching them.")
@click.option("--compression", type=click.Choice(["zstd", "gzip", "none"]), default=None,
              help="Data compression [default: zstd for zarr and parquet, none for tfrecord].")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of --split-by series.")
@click.option("--block-rows", type=int, default=None,
              help="Rows per storage block (chunk, record, row group); default: a power of "
                   "two near 1 MiB.")
@click.option("--shard-size", type=ByteSize(), default="64MiB", show_default=True,
              help="Raw bytes of rows per data file (TFRecord shard, Parquet part).")
@click.option("--shards", type=int, default=None, help="Number of data files (overrides "
              "--shard-size).")
@click.option("--workers", type=int, default=1, show_default=True,
              help="Processes writing shards in parallel.")
@click.option("--overwrite", is_flag=True,
              help="Replace an existing windowkit store (or fill an empty directory); "
                   "anything else at --out is refused, and so is an --out holding a source.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@_one_line_errors
def convert(sources: tuple[str, ...], fmt: str, out: str, length: int, stride: int,
            sampling_rate: int, horizon: int, compression: str | None, seed: int,
            block_rows: int | None, shard_size: int, shards: int | None, workers: int,
            overwrite: bool, quiet: bool, series_col: str | None, time_col: str | None,
            columns: str | None, max_gap: str | None, splits: str | None, split_by: str,
            split_at: str | None, nan: str, target_columns: str | None,
            sort_memory: int, time_format: str | None) -> None:
    """Convert SOURCES into a store: .npy files or globs (one series each), or one
    CSV or Parquet table (long form with --series-col, or one wide series).

    Running the same command again after an interruption resumes it."""
    if quiet:
        logging.getLogger("windowkit").setLevel(logging.WARNING)
    from windowkit.conversion import convert as run_convert
    from windowkit.spec import WindowSpec

    spec = WindowSpec(length=length, stride=stride, sampling_rate=sampling_rate, horizon=horizon)
    source: Any = sources[0] if len(sources) == 1 else list(sources)
    store = run_convert(source, out, format=fmt, window=spec, compression=compression,
                        seed=seed, block_rows=block_rows, shard_size=shard_size,
                        shards=shards, workers=workers, overwrite=overwrite,
                        progress=not quiet, series_col=series_col, time_col=time_col,
                        columns=[c.strip() for c in columns.split(",")] if columns else None,
                        max_gap=max_gap, splits=splits, split_by=split_by, split_at=split_at,
                        nan=nan, target_columns=target_columns.split(",")
                        if target_columns else None, sort_memory=sort_memory,
                        time_format=time_format)
    if not quiet:
        total = sum(store.num_windows(s) for s in store.splits)
        click.echo(f"wrote {out}: {store.manifest.format}, "
                   f"{store.manifest.series['count']} series, {total} windows", err=True)


@main.command()
@click.argument("store_path", metavar="STORE")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary.")
@_one_line_errors
def inspect(store_path: str, as_json: bool) -> None:
    """Show what a store holds."""
    from windowkit.inspection import describe, render

    summary = describe(store_path)
    click.echo(json.dumps(summary, indent=2) if as_json else render(summary))


@main.command()
@click.argument("store_path", metavar="STORE")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@_one_line_errors
def verify(store_path: str, quiet: bool) -> None:
    """Re-check every file of STORE against its manifest (sizes, checksums, rows, index)."""
    from windowkit.verify import verify_store

    problems = verify_store(store_path, progress=not quiet)
    for problem in problems:
        click.echo(f"windowkit: verify: {problem}", err=True)
    if problems:
        sys.exit(1)
    click.echo(f"{store_path}: ok")


@main.command()
@click.argument("store_path", metavar="STORE")
@click.option("--split", default="train", show_default=True, help="Split to read.")
@click.option("--batch-size", type=int, default=256, show_default=True, help="Windows per batch.")
@click.option("--reader", type=click.Choice(["tf", "keras"]), default="tf", show_default=True,
              help="tf: Store.tf_dataset; keras: Store.keras_dataset.")
@click.option("--batches", type=int, default=None,
              help="Batches to time after the warm-up [default: the rest of one epoch].")
@click.option("--warmup", type=int, default=5, show_default=True,
              help="Batches read before timing starts.")
@click.option("--baseline", is_flag=True,
              help="Also time every window materialized in memory, shuffle(10000).batch(B).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              help="Draw the stage timeline and throughput to this PNG.")
@click.option("--json", "as_json", is_flag=True, help="Print the measurements as JSON.")
@click.option("--seed", type=int, default=0, show_default=True, help="Shuffle seed.")
@_one_line_errors
def bench(store_path: str, split: str, batch_size: int, reader: str, batches: int | None,
          warmup: int, baseline: bool, plot_path: str | None, as_json: bool, seed: int) -> None:
    """Measure how fast STORE's reader delivers windows, and where the time goes."""
    from windowkit.bench import plot, render, run_bench
    from windowkit.store import open_store

    report = run_bench(open_store(store_path), split=split, batch_size=batch_size,
                       reader=reader, batches=batches, warmup=warmup, baseline=baseline,
                       seed=seed)
    if plot_path:
        plot(report, plot_path)
    click.echo(json.dumps(report.to_dict(), indent=2) if as_json else render(report))
