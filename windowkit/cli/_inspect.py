"""``windowkit inspect``: what a store holds."""

from __future__ import annotations

import json

import click

from windowkit.cli._common import one_line_errors


@click.command()
@click.argument("store_path", metavar="STORE")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              help="Also draw series lengths, split coverage and skipped windows to this PNG.")
@one_line_errors
def inspect(store_path: str, as_json: bool, plot_path: str | None) -> None:
    """Show what a store holds."""
    from windowkit.inspection import describe, plot, render

    summary = describe(store_path)
    if plot_path:
        plot(store_path, plot_path)
    click.echo(json.dumps(summary, indent=2) if as_json else render(summary))
