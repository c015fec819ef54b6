"""Dataset files: rows of a JSONL (or .jsonl.gz) or parquet file, or of a folder of
Harbor tasks (``harbor``: one row per task folder), as API tasks.

Shared by ``rollserve datasets validate``, ``images pull`` and ``run``. A row is
either a task as ``POST /v1/rollouts`` takes it (``{"data_source", "instance",
"n"?, "sampling"?, "agent"?, "timeouts"?, "metadata"?, "id"?}``, plus an optional
``task_id``: the dataset's own name for the row, kept in ``metadata.task_id``), or,
when a data source is given, a bare instance (e.g. one SWE-bench record per row).

This module only reads and reshapes; checking rows against handlers is
``rollserve.commands.dataset_check``. Like the whole ``rollserve.datasets`` package it
imports nothing of the server side, so a trainer can use it with the client alone.
pyarrow is imported only for parquet.
"""

from __future__ import annotations

import datetime
import decimal
import gzip
import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollserve.datasets.harbor import harbor_records

PARQUET_SUFFIXES = (".parquet", ".pq")
# Keys a dataset uses to name its rows (the first one present is shown in reports).
LABEL_KEYS = ("task_id", "instance_id", "id")
_ID_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


class DatasetError(Exception):
    """The file as a whole cannot be read (missing, not JSONL, not parquet)."""


@dataclass
class DatasetRow:
    number: int  # 1-based: the JSONL line number, or the parquet row number
    task: dict[str, Any] | None  # the row as an API task; None when it is not one
    error: str | None = None  # why it is not a task: "field: message"
    label: str | None = None  # the dataset's own name for the row, if it has one

    @property
    def data_source(self) -> str | None:
        source = (self.task or {}).get("data_source")
        return source if isinstance(source, str) else None

    @property
    def instance(self) -> Any:
        return (self.task or {}).get("instance")


def read_dataset(path: Path | str, data_source: str | None = None) -> list[DatasetRow]:
    """Every row of ``path`` as a task (bare instances of ``data_source`` if given).

    Raises ``DatasetError`` for a file that cannot be read; a row that is readable
    but not a task comes back with ``error`` set.
    """
    if data_source is not None and Path(path).is_dir():
        raise DatasetError(
            f"{path}: a folder of Harbor tasks: its rows are harbor tasks, not bare "
            f"instances of {data_source!r} (leave out the data source)"
        )
    rows = [_to_row(number, record, data_source) for number, record in read_records(path)]
    if not rows:
        raise DatasetError(f"{path}: no rows")
    return rows


def read_records(path: Path | str) -> Iterator[tuple[int, Any]]:
    """(row number, decoded row) for each row of a JSONL or parquet file, or each task
    of a folder of Harbor tasks (numbered from 1 in name order)."""
    path = Path(path)
    if path.is_dir():
        try:
            yield from enumerate(harbor_records(path), start=1)
        except (ValueError, OSError) as exc:
            raise DatasetError(str(exc)) from None
        return
    if not path.is_file():
        raise DatasetError(f"{path}: no such file")
    if path.suffix.lower() in PARQUET_SUFFIXES:
        yield from _parquet_records(path)
    else:
        yield from _jsonl_records(path)


def _jsonl_records(path: Path) -> Iterator[tuple[int, Any]]:
    opener = gzip.open if path.suffix.lower() == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            for number, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    yield number, json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DatasetError(
                        f"{path}, line {number}: not valid JSON ({exc.msg} at column {exc.colno}); "
                        "expected one JSON object per line (JSONL), or a .parquet file"
                    ) from None
    except (UnicodeDecodeError, gzip.BadGzipFile, EOFError) as exc:
        raise DatasetError(f"{path}: cannot be read as JSONL text: {exc}") from None
    except OSError as exc:
        raise DatasetError(f"{path}: {exc.strerror or exc}") from None


def _parquet_records(path: Path) -> Iterator[tuple[int, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DatasetError(f"{path}: reading parquet needs pyarrow: pip install pyarrow") from None
    try:
        parquet = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow's ArrowInvalid and friends
        raise DatasetError(f"{path}: not a readable parquet file: {exc}") from None
    number = 0
    for batch in parquet.iter_batches(batch_size=1024):
        for record in batch.to_pylist():
            number += 1
            yield number, _from_parquet(record)


def _from_parquet(value: Any) -> Any:
    """A parquet value as JSON: a null struct field is an absent key (parquet gives
    every row every field of the column's schema), dates become ISO strings."""
    if isinstance(value, dict):
        return {k: _from_parquet(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_from_parquet(v) for v in value]
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value


def _label(*sources: Any) -> str | None:
    for source in sources:
        if isinstance(source, dict):
            for key in LABEL_KEYS:
                value = source.get(key)
                if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value):
                    return str(value)
    return None


def _to_row(number: int, record: Any, data_source: str | None) -> DatasetRow:
    if not isinstance(record, dict):
        return DatasetRow(number, None, f"row: must be a JSON object, got {type(record).__name__}")
    if data_source is not None:  # a bare instance
        return DatasetRow(number, {"data_source": data_source, "instance": record}, label=_label(record))
    task = dict(record)
    if isinstance(task.get("instance"), str):  # parquet datasets often hold it as JSON text
        try:
            task["instance"] = json.loads(task["instance"])
        except json.JSONDecodeError:
            pass  # left as is: the check names it
    label = _label(task, task.get("instance"))
    if "instance" not in task:
        return DatasetRow(
            number,
            None,
            "instance: required (each row is a task {data_source, "
            "instance, n?}; for rows that are bare instances pass --data-source NAME)",
            label=label,
        )
    task_id = task.pop("task_id", None)
    if task_id is not None:  # the dataset's name for the row: not an API field, kept in metadata
        metadata = task.get("metadata")
        if metadata is None or isinstance(metadata, dict):
            task["metadata"] = {"task_id": task_id, **(metadata or {})}
    return DatasetRow(number, task, label=label)


def client_id(dataset: str, number: int, task: dict[str, Any], settings: dict[str, Any] | None = None) -> str:
    """A stable id for submitting row ``number`` of ``dataset`` as ``task`` (the API's
    idempotency key).

    The same row of the same dataset, asked for with the same settings, always gets
    the same id: resubmitting after a crash returns the server's existing group
    instead of running it again. A changed row or changed settings get a new id
    (new work), never a conflict. A row's own ``id`` is used as it is.
    """
    if task.get("id"):
        return str(task["id"])
    body = {"task": {k: v for k, v in task.items() if k != "id"}, "settings": settings or {}}
    digest = hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()
    name = _ID_UNSAFE.sub("_", dataset).strip("._-")[:60] or "dataset"
    return f"{name}/{number}-{digest[:12]}"


def dataset_name(path: Path | str) -> str:
    """The name a dataset file's ids start with: its file name without suffixes (a
    folder's: its name)."""
    name = Path(path).resolve().name if Path(path).is_dir() else Path(path).name
    for suffix in (".gz", ".jsonl", ".json", *PARQUET_SUFFIXES):
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
    return name
