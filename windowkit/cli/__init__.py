"""The ``windowkit`` command line: one module per command, each only parsing
options and calling the library. Every library error becomes one line on
stderr and exit status 2."""

from __future__ import annotations

import logging

import click

from windowkit.cli._bench import bench
from windowkit.cli._common import OneLineUsageErrors
from windowkit.cli._convert import convert
from windowkit.cli._inspect import inspect
from windowkit.cli._verify import verify


@click.group(cls=OneLineUsageErrors,
             context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="windowkit")
def main() -> None:
    """Convert time series into window stores; inspect, verify and benchmark them."""
    # TensorFlow's C++ start-up lines (CUDA probing, CPU features) are noise here;
    # its real errors reach Python as exceptions: importing windowkit (above, the
    # commands' modules) keeps them off stderr unless the user set
    # TF_CPP_MIN_LOG_LEVEL (windowkit._quiet)
    messages = logging.getLogger("windowkit")  # e.g. "resuming an interrupted conversion"
    if not any(isinstance(h, logging.StreamHandler) for h in messages.handlers):
        handler = logging.StreamHandler()  # stderr (the package's own is a NullHandler)
        handler.setFormatter(logging.Formatter("windowkit: %(message)s"))
        messages.addHandler(handler)
        messages.setLevel(logging.INFO)


for command in (convert, inspect, verify, bench):
    main.add_command(command)

__all__ = ["main"]
