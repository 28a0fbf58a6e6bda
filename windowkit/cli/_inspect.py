"""``windowkit inspect``: what a store holds."""

from __future__ import annotations

import json

import click

from windowkit.cli._common import one_line_errors


@click.command()
@click.argument("store_path", metavar="STORE")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary.")
@one_line_errors
def inspect(store_path: str, as_json: bool) -> None:
    """Show what a store holds."""
    from windowkit.inspection import describe, render

    summary = describe(store_path)
    click.echo(json.dumps(summary, indent=2) if as_json else render(summary))
