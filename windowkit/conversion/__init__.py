"""Conversion: sources -> parts of rows in a format -> index tables -> manifest,
built in a locked, resumable workspace and published atomically."""

from windowkit._walk import walk_files
from windowkit.conversion._parts import PartResult, true_runs
from windowkit.conversion._pipeline import convert
from windowkit.conversion._target import Workspace, check_target

__all__ = ["PartResult", "Workspace", "check_target", "convert", "true_runs", "walk_files"]
