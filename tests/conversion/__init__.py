"""Tests of windowkit.conversion: safe, resumable conversion, locally, on S3 and on Dask."""
