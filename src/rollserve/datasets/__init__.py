"""Datasets: reading dataset files as API tasks (``files``) and the sets shipped with
rollserve (``bundled``).

Neutral: pure Python (pyarrow only for parquet), importing nothing of the server, so
the client (``rollserve run`` against a remote server, a trainer) uses it as the
server's commands do.

Where datasets are handled (this package reads them; the rest use it):

- ``harbor``: a folder of Harbor tasks as a dataset (one row per task folder),
  read by ``files`` as a dataset file is; ``rollserve datasets oracle`` lists its
  tasks with it.
- ``rollserve/data/``: the bundled task files (JSONL) and swe-mini's git bundles,
  found through ``bundled``.
- ``commands/datasets.py``, ``commands/images.py``, ``commands/run.py``: the
  ``rollserve datasets | images | run`` commands (typer wiring and output).
- ``commands/dataset_check.py``: a dataset's rows checked offline as the API checks a
  submission, with the server's handlers (so it is on the server side, with the
  commands).
- ``client/run_dataset.py``: running a whole dataset through a server, resumable
  (``rollserve run``; client side, so it needs no server install).
- ``handlers/<family>/instances.py`` (``math``, ``swe``): what one row's ``instance``
  means to its task family (its validation and normal form).
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
from rollserve.datasets.harbor import harbor_records, harbor_root, task_folders

__all__ = [
    "BUNDLED",
    "DATA_DIR",
    "LABEL_KEYS",
    "PARQUET_SUFFIXES",
    "SWE_MINI",
    "SWE_MINI_BUNDLES",
    "BundledSet",
    "DatasetError",
    "DatasetRow",
    "bundled_rows",
    "bundled_set",
    "client_id",
    "dataset_name",
    "harbor_records",
    "harbor_root",
    "read_dataset",
    "read_records",
    "task_folders",
]
