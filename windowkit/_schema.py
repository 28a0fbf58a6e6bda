"""Building blocks of the manifest schema (pydantic v2), shared by the manifest
and the formats' sections of it.

A store is untrusted input: every value of ``windowkit.json`` is checked for
type and range before anything is read or allocated from it, and every path in
it must be relative, normalized and inside the store.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from windowkit.errors import StoreError

#: Limits that keep allocations sized by a manifest bounded.
MAX_ROWS = 1 << 48
MAX_BLOCK_BYTES = 1 << 30  # one storage block, decoded
MAX_STEP_ITEMS = 1 << 26  # values in one row
MAX_SPAN = 1 << 24  # rows one window covers


def check_store_path(path: str) -> str:
    """``path`` if it is a relative, normalized POSIX path inside the store."""
    parts = path.split("/")
    if (not path or path.startswith("/") or any(c in path for c in "\\:\0")
            or any(part in ("", ".", "..") for part in parts)):
        raise ValueError(f"path {path!r} must be relative, normalized and inside the store "
                         "(no leading '/', no '..', '.', '//', '\\' or ':')")
    return path


#: A path in the manifest, relative to the store root.
StorePath = Annotated[str, AfterValidator(check_store_path)]
Count = Annotated[int, Field(ge=0, le=MAX_ROWS)]
Positive = Annotated[int, Field(ge=1, le=MAX_ROWS)]
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
HexId = Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]
Name = Annotated[str, Field(min_length=1, max_length=256)]


class Strict(BaseModel):
    """A manifest section: exact JSON types, no unknown keys, immutable."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


def describe_error(error: ValidationError) -> str:
    """The first problem of a validation error, as ``field 'a.b.0': message``."""
    first = error.errors(include_url=False)[0]
    where = ".".join(str(part) for part in first["loc"])
    message = re.sub(r"^(Value|Assertion) error, ", "", first["msg"])
    more = f" (and {error.error_count() - 1} more problems)" if error.error_count() > 1 else ""
    return (f"field {where!r}: {message}" if where else message) + more


def context_value(info: Any, key: str) -> Any:
    """A value passed to validation as ``context`` (None when absent)."""
    context = getattr(info, "context", None) or {}
    return context.get(key)


def check_columns(where: Any, schema: Any, expected: dict[str, Any], what: str, *,
                  exact: bool = False) -> None:
    """Raise :class:`StoreError` naming ``where`` unless the Arrow ``schema`` has each
    column of ``expected`` (name: a pyarrow type, or a predicate on the type) and,
    with ``exact``, no other column."""
    names = list(schema.names)
    if len(set(names)) != len(names):
        raise StoreError(f"{where}: is not a {what} (a column name appears twice)")
    for name, want in expected.items():
        if name not in names:
            raise StoreError(f"{where}: is not a {what} (no column {name!r})")
        got = schema.field(name).type
        ok = want(got) if callable(want) else got == want
        if not ok:
            wanted = getattr(want, "__doc__", None) if callable(want) else str(want)
            raise StoreError(f"{where}: is not a {what} (column {name!r} is {got}, "
                             f"expected {wanted})")
    extra = [name for name in names if name not in expected]
    if exact and extra:
        raise StoreError(f"{where}: is not a {what} (unexpected column {extra[0]!r})")
