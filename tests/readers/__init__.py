"""Tests of windowkit.readers: both engines, both front ends, shuffling and sharding."""
