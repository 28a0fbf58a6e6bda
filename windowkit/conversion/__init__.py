"""Conversion: sources -> shards of rows in a format -> index tables -> manifest,
built in a locked, resumable workspace and published atomically."""

from windowkit.conversion._pipeline import convert
from windowkit.conversion._shards import ShardResult, true_runs
from windowkit.conversion._workspace import Workspace, check_target, walk_files

__all__ = ["ShardResult", "Workspace", "check_target", "convert", "true_runs", "walk_files"]
