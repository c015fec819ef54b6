"""Datasets: reading dataset files as API tasks (``files``) and the sets shipped with
rollserve (``bundled``).

Neutral: pure Python (pyarrow only for parquet), importing nothing of the server, so
the client (``rollserve run`` against a remote server, a trainer) uses it as the
server's commands do.
"""

from rollserve.datasets.bundled import (
    BUNDLED,
    DATA_DIR,
    SWE_MINI,
    SWE_MINI_BUNDLES,
    BundledSet,
    bundled_rows,
    bundled_set,
)
from rollserve.datasets.files import (
    LABEL_KEYS,
    PARQUET_SUFFIXES,
    DatasetError,
    DatasetRow,
    client_id,
    dataset_name,
    read_dataset,
    read_records,
)

__all__ = [
    "BUNDLED", "DATA_DIR", "LABEL_KEYS", "PARQUET_SUFFIXES", "SWE_MINI", "SWE_MINI_BUNDLES",
    "BundledSet", "DatasetError", "DatasetRow", "bundled_rows", "bundled_set", "client_id",
    "dataset_name", "read_dataset", "read_records",
]
