"""``windowkit bench``: how fast a store's reader delivers windows."""

from __future__ import annotations

import json

import click

from windowkit.cli._common import one_line_errors


@click.command()
@click.argument("store_path", metavar="STORE")
@click.option("--split", default="train", show_default=True, help="Split to read.")
@click.option("--batch-size", type=int, default=256, show_default=True, help="Windows per batch.")
@click.option("--reader", type=click.Choice(["tf", "keras"]), default="tf", show_default=True,
              help="tf: Store.tf_dataset; keras: Store.keras_dataset.")
@click.option("--shuffle", default="true", show_default=True, metavar="true|global|blocks|false",
              help="The reader's shuffle= argument: true (the default: uniform when the "
                   "split fits the memory budget, else block groups), global, blocks, false.")
@click.option("--batches", type=int, default=None,
              help="Batches to time after the warm-up; more than an epoch holds runs more "
                   "epochs [default: the rest of one epoch].")
@click.option("--warmup", type=int, default=5, show_default=True,
              help="Batches read before timing starts (at most a quarter of an epoch).")
@click.option("--baseline", is_flag=True,
              help="Also time every window materialized in memory, shuffle(10000).batch(B).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              help="Draw the stage timeline and throughput to this PNG.")
@click.option("--json", "as_json", is_flag=True, help="Print the measurements as JSON.")
@click.option("--seed", type=int, default=0, show_default=True, help="Shuffle seed.")
@one_line_errors
def bench(store_path: str, split: str, batch_size: int, reader: str, shuffle: str,
          batches: int | None,
          warmup: int, baseline: bool, plot_path: str | None, as_json: bool, seed: int) -> None:
    """Measure how fast STORE's reader delivers windows, and where the time goes.

    Any store: plain or dict batches (known-future, static parts), any size
    (a small split gets fewer warm-up batches, and bench says so)."""
    from windowkit.bench import plot, render, run_bench
    from windowkit.store import open_store

    report = run_bench(open_store(store_path), split=split, batch_size=batch_size,
                       reader=reader, shuffle=shuffle, batches=batches, warmup=warmup,
                       baseline=baseline, seed=seed)
    if plot_path:
        plot(report, plot_path)
    click.echo(json.dumps(report.to_dict(), indent=2) if as_json else render(report))
