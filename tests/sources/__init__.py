"""Tests of windowkit.sources: arrays, tables and what a source may hold."""
