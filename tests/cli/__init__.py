"""Tests of windowkit.cli: the commands."""
