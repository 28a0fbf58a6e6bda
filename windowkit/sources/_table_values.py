"""A record batch's feature columns as one numeric array, checked.

Staging writes the feature values of each row as one ``[rows, features]``
array in the table's dtype. Turning the columns into it is where empty
values, non-numeric columns and values that do not fit ``--dtype`` are found,
and each is refused with the file, row, series and column it is in.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from windowkit.errors import SourceError
from windowkit.sources._row_locator import RowLocator, first_null
from windowkit.sources._table_schema import TableColumns, TableOptions

_MISFIT = {True: "it overflows to infinity", False: "not a value of it"}


class FeatureValues:
    """Reads the feature values ``[rows, features]`` of each batch: numeric,
    empty only where allowed (then NaN), cast to the dtype asked for."""

    def __init__(self, columns: TableColumns, options: TableOptions, allow_missing: bool,
                 rows: RowLocator) -> None:
        self.features = columns.features
        self.dtype = columns.dtype
        self.cast_asked = options.dtype is not None  # --dtype: cast, and check the cast
        self.series_col = options.series_col
        self.allow_missing = allow_missing  # empty values become NaN (nan="skip")
        self.rows = rows

    def read(self, batch: pa.RecordBatch) -> np.ndarray:
        """The feature values ``[rows, features]``, checked: numeric, and empty
        only where allowed (then NaN)."""
        whole = self._at_once(batch)
        if whole is not None:
            return whole
        columns = [self._column(batch, name) for name in self.features]
        return np.column_stack(columns).astype(self.dtype.newbyteorder("<"), copy=False)

    def _at_once(self, batch: pa.RecordBatch) -> np.ndarray | None:
        """The values in one step (a wide table's thousands of columns are
        seconds one by one) when every feature column has the dtype's own
        numeric type and no empty value: nothing to check or cast. Else None:
        column by column, where each check names what it finds."""
        try:
            chosen = batch if batch.schema.names == list(self.features) else batch.select(
                list(self.features))
        except (KeyError, pa.ArrowInvalid):
            return None  # column by column says what is wrong
        kinds = set(chosen.schema.types)
        if len(kinds) != 1:
            return None
        kind = kinds.pop()
        if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)) or np.dtype(
                kind.to_pandas_dtype()) != self.dtype:
            return None
        try:  # refuses empty values (nulls)
            values = chosen.to_tensor(row_major=True).to_numpy()
        except (pa.ArrowTypeError, pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
        return values.astype(self.dtype.newbyteorder("<"), copy=False)

    def _column(self, batch: pa.RecordBatch, name: str) -> np.ndarray:
        """One feature column's values, checked and cast."""
        column = batch.column(name)
        if column.null_count and not (self.allow_missing and self.dtype.kind == "f"):
            at = first_null(column)
            hint = ("; --nan skip needs float feature columns" if self.allow_missing else
                    "; missing values are not allowed (--nan skip keeps the rows and "
                    "leaves out the windows touching them)")
            where, row = self.rows.in_batch(at)
            raise SourceError(f"{where}: {self._series_at(batch, at)}row {row}, "
                              f"column {name!r} is missing (empty or NaN){hint}")
        if not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type)
                or pa.types.is_boolean(column.type)):
            where, row = self.rows.in_batch(0)
            raise SourceError(f"{where}: column {name!r} is not numeric near row "
                              f"{row} ({column.type})")
        if column.null_count:  # allowed: NaN, and the windows touching it are skipped
            column = column.cast(pa.float64()).fill_null(np.nan)
        return self._cast(column.to_numpy(zero_copy_only=False), name, batch)

    def _cast(self, values: np.ndarray, column: str, batch: pa.RecordBatch) -> np.ndarray:
        """A column's values in the ``dtype`` asked for, checked: a float value
        that overflows to infinity, or one an integer dtype cannot hold, is an
        error naming the column and row."""
        if not self.cast_asked or values.dtype == self.dtype:
            return values
        with np.errstate(over="ignore", invalid="ignore"):
            cast = values.astype(self.dtype)
            wide = values.astype(np.float64)
            if self.dtype.kind == "f":
                bad = np.isinf(cast) & np.isfinite(wide)
            else:
                info = np.iinfo(self.dtype)
                bad = ~np.isfinite(wide) | (wide != np.round(wide)) | (wide < info.min) | (
                    wide > info.max)
        if not bad.any():
            return cast
        at = int(np.flatnonzero(bad)[0])
        where, row = self.rows.in_batch(at)
        raise SourceError(f"{where}: {self._series_at(batch, at)}row {row}, column "
                          f"{column!r}: {values[at].item()!r} does not fit --dtype {self.dtype} "
                          f"({_MISFIT[self.dtype.kind == 'f']}); choose a wider --dtype")

    def _series_at(self, batch: pa.RecordBatch, at: int) -> str:
        """``series 'KEY', `` of the batch's row ``at``, or nothing without a series column."""
        if self.series_col is None:
            return ""
        return f"series {str(batch.column(self.series_col)[at].as_py())!r}, "
