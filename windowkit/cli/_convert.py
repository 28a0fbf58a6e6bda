"""``windowkit convert``: sources into a store."""

from __future__ import annotations

import logging
import os
from typing import Any

import click

from windowkit.cli._common import ByteSize, one_line_errors, signals_interrupt
from windowkit.formats import FORMAT_NAMES


@click.command()
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
              help="Table sources: the time column (integers, dates or timestamps; ISO "
                   "text such as 2001-01-31 or 2001-01-01T01:00+01:00 too).")
@click.option("--time-format", default=None,
              help="Table sources: the format of a text time column, in strptime codes "
                   "(e.g. %Y/%m/%d, '%d.%m.%Y %H:%M'); ISO times need none.")
@click.option("--no-header", is_flag=True,
              help="CSV sources: the file has no header line; its columns are named "
                   "0, 1, ... (e.g. --columns 0).")
@click.option("--columns", default=None,
              help="Table sources: feature columns, comma-separated [default: all others].")
@click.option("--dtype", default=None, metavar="DTYPE",
              help="Table sources: store the values as DTYPE (float32, float64, int32, ...), "
                   "checked: a value that overflows is an error [default: the columns' own].")
@click.option("--target-columns", default=None,
              help="Columns the targets y hold, comma-separated (needs --horizon) "
                   "[default: all].")
@click.option("--static-columns", default=None,
              help="Table sources: columns constant within each series (kept once per "
                   "series, not as features); batches carry them as static.")
@click.option("--known-columns", default=None,
              help="Feature columns whose future values are known ahead (calendar, planned "
                   "prices): batches carry them over the horizon (needs --horizon).")
@click.option("--sort-memory", type=ByteSize(), default="1GiB", show_default=True,
              help="Largest long table (its size in memory) whose interleaved series "
                   "are grouped in memory; a larger one is refused.")
@click.option("--max-gap", default=None,
              help="Largest time step a window may span (needs --time-col): a number on "
                   "integer times; on dates and timestamps a duration with its unit, e.g. "
                   "960s, 16min, 1h, 2D [default: 1.5 steps of each series: one missed "
                   "sample is a gap].")
@click.option("--split", "splits", default=None,
              help="Splits by fraction, e.g. train=0.8,val=0.1,test=0.1 [default: all train]; "
                   "with --split-at, their names alone, e.g. fit,check,hold.")
@click.option("--split-by", type=click.Choice(["time", "series"]), default="time",
              show_default=True, help="Cut each series in time, or assign whole series "
              "(seeded by --seed).")
@click.option("--split-at", default=None,
              help="Split at increasing points in time of --time-col instead, e.g. "
                   "2015,2018 (on dates or timestamps a year is its 1 January), "
                   "2020-01-01,2022-01-01 or 2021-03-28T12:00+02:00 (UTC without an "
                   "offset); the splits are train, val, test unless --split names them.")
@click.option("--split-context", type=click.Choice(["none", "history"]), default="none",
              show_default=True,
              help="history: a val/test window's inputs may come from the rows before its "
                   "split (its targets lie in the split); none: all its rows do.")
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
@click.option("--part-size", type=ByteSize(), default="64MiB", show_default=True,
              help="Raw bytes of rows per part: a run of whole blocks, written as one data "
                   "file (TFRecord, Parquet).")
@click.option("--parts", type=int, default=None, help="Number of parts (overrides "
              "--part-size).")
# the old names of --part-size and --parts (data files were once called shards)
@click.option("--shard-size", type=ByteSize(), default=None, hidden=True)
@click.option("--shards", type=int, default=None, hidden=True)
@click.option("--workers", type=int, default=1, show_default=True,
              help="Processes writing parts in parallel.")
@click.option("--dask", "dask_address", default=None, metavar="ADDRESS",
              help="Write the parts as tasks on the Dask cluster whose scheduler is at "
                   "ADDRESS (e.g. tcp://10.0.0.5:8786); its workers must share --out's "
                   "file system.")
@click.option("--overwrite", is_flag=True,
              help="Replace an existing windowkit store (or fill an empty directory); "
                   "anything else at --out is refused, and so is an --out holding a source.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@one_line_errors
def convert(sources: tuple[str, ...], fmt: str, out: str, length: int, stride: int,
            sampling_rate: int, horizon: int, compression: str | None, seed: int,
            block_rows: int | None, part_size: int, parts: int | None,
            shard_size: int | None, shards: int | None, workers: int,
            dask_address: str | None,
            overwrite: bool, quiet: bool, series_col: str | None, time_col: str | None,
            columns: str | None, max_gap: str | None, splits: str | None, split_by: str,
            split_at: str | None, split_context: str, nan: str, target_columns: str | None,
            known_columns: str | None, static_columns: str | None,
            sort_memory: int, time_format: str | None, dtype: str | None,
            no_header: bool) -> None:
    """Convert SOURCES into a store: .npy files or globs (one series each), or a
    table (long form with --series-col, or one wide series): a CSV or Parquet
    file, several (files, globs), or a directory of Parquet files (hive-style
    partitions such as sensor=a/ become columns), read in path order as one.

    Running the same command again after an interruption resumes it. SIGINT
    (Ctrl-C) and SIGTERM stop it, and its workers, with one line and exit
    status 130 or 143 (128 + the signal's number), keeping what it finished."""
    if quiet:
        logging.getLogger("windowkit").setLevel(logging.WARNING)
    from windowkit.conversion import convert as run_convert
    from windowkit.conversion.options import cli_spelling
    from windowkit.spec import WindowSpec

    spec = WindowSpec(length=length, stride=stride, sampling_rate=sampling_rate, horizon=horizon)
    source: Any = sources[0] if len(sources) == 1 else list(sources)
    # without --overwrite a conversion over a store succeeds only with nothing to do
    built = not overwrite and os.path.isdir(out) and any(os.scandir(out))
    with signals_interrupt("the conversion was", "the finished parts are kept: run the "
                           "same command again to resume it"), cli_spelling():
        store = run_convert(
            source, out, format=fmt, window=spec, compression=compression, seed=seed,
            block_rows=block_rows, part_size=part_size, parts=parts, shard_size=shard_size,
            shards=shards, workers=workers,
            dask=dask_address, overwrite=overwrite, progress=not quiet,
            series_col=series_col, time_col=time_col,
            columns=[c.strip() for c in columns.split(",")] if columns else None,
            max_gap=max_gap, splits=splits, split_by=split_by, split_at=split_at,
            split_context=split_context, nan=nan,
            target_columns=_names(target_columns), known_columns=_names(known_columns),
            static_columns=_names(static_columns),
            sort_memory=sort_memory, time_format=time_format, dtype=dtype,
            header=None if no_header else 0)
    if not quiet and not built:  # else the library said there was nothing to do
        total = sum(store.num_windows(s) for s in store.splits)
        click.echo(f"wrote {out}: {store.manifest.format}, "
                   f"{store.manifest.series.count} series, {total} windows", err=True)


def _names(text: str | None) -> list[str] | None:
    """A comma-separated list of columns."""
    return text.split(",") if text else None
