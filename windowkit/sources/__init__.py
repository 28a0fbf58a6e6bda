"""Input series: ``.npy`` files and arrays (:mod:`._arrays`), and tables, CSV,
Parquet and DataFrames, staged to memory-mapped files (:mod:`._tables`), with
their time columns (:mod:`._times`) and, when their series interleave,
grouped first (:mod:`._interleaved`); several table files (a list, a glob, a
directory of parts, hive partitions) are read as one table (:mod:`._datasets`)."""

from windowkit.sources._arrays import (
    ArraySeries,
    NpySeries,
    RemoteNpySeries,
    Series,
    SourceLike,
    check_consistent,
    check_finite,
    open_sources,
    source_files,
)
from windowkit.sources._datasets import csv_file, numeric_header
from windowkit.sources._pins import SourcePins, changed_rows, check_regular
from windowkit.sources._staging import StagedSeries
from windowkit.sources._table_schema import TableOptions
from windowkit.sources._tables import (
    DEFAULT_SORT_MEMORY,
    estimate_staged_bytes,
    is_table,
    stage_table,
)
from windowkit.sources._times import (
    check_increasing_points,
    check_split_points,
    parse_gap,
    parse_time,
    point_text,
)

__all__ = ["DEFAULT_SORT_MEMORY", "ArraySeries", "NpySeries", "RemoteNpySeries", "Series",
           "SourceLike", "SourcePins", "StagedSeries", "TableOptions", "changed_rows",
           "check_consistent", "check_finite", "check_increasing_points", "check_regular",
           "check_split_points", "csv_file", "estimate_staged_bytes", "is_table",
           "numeric_header",
           "open_sources", "parse_gap", "parse_time", "point_text", "source_files",
           "stage_table"]
