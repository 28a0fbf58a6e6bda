"""``windowkit verify``: every file of a store against its manifest."""

from __future__ import annotations

import sys

import click

from windowkit.cli._common import one_line_errors


@click.command()
@click.argument("store_path", metavar="STORE")
@click.option("--fast", is_flag=True,
              help="Check sizes, checksums and tables only; do not decode the data.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@one_line_errors
def verify(store_path: str, fast: bool, quiet: bool) -> None:
    """Re-check STORE against its manifest: every file's size and checksum, the
    series and index tables, and (unless --fast) every storage block, decoded."""
    from windowkit.verify import verify_store

    problems = verify_store(store_path, progress=not quiet, fast=fast)
    for problem in problems:
        click.echo(f"windowkit: verify: {problem}", err=True)
    if problems:
        sys.exit(1)
    click.echo(f"{store_path}: ok")
