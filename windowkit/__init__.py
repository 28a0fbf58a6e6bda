"""windowkit: sliding windows from time-series stores, fed to TensorFlow/Keras.

Store every row once, store windows as an index table ``(series, start,
length)``, cut windows in vectorized batches at read time.
"""

# first: before anything imports TensorFlow, keep its C++ start-up lines off stderr
# unless the user set TF_CPP_MIN_LOG_LEVEL (windowkit._quiet)
import windowkit._quiet  # noqa: F401  (isort: skip)
import logging

from windowkit._version import __version__
from windowkit.conversion import convert
from windowkit.errors import (
    DiskSpaceError,
    InvalidSpecError,
    NotAStoreError,
    SourceError,
    SourceNotFoundError,
    StoreError,
    StoreExistsError,
    StoreReplacedError,
    StoreUnreachableError,
    WindowkitError,
)
from windowkit.formats import FORMAT_NAMES, FORMATS
from windowkit.spec import WindowSpec
from windowkit.store import Store, open_store

# a library's logger: silent unless the application configures logging
logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "FORMATS",
    "FORMAT_NAMES",
    "DiskSpaceError",
    "InvalidSpecError",
    "NotAStoreError",
    "SourceError",
    "SourceNotFoundError",
    "Store",
    "StoreError",
    "StoreExistsError",
    "StoreReplacedError",
    "StoreUnreachableError",
    "WindowSpec",
    "WindowkitError",
    "__version__",
    "convert",
    "open_store",
]
