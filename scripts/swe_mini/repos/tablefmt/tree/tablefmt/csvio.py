"""Reading and writing CSV."""

from __future__ import annotations

import csv
import io
import os
from typing import Any, TextIO, Union

from .table import Table


def _convert(text: str) -> Any:
    if text == "":
        return None
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def read_csv(source: Union[str, TextIO], *, delimiter: str = ",", convert: bool = True) -> Table:
    """Read CSV text (or an open text file) whose first row holds the headers.

    Blank lines are skipped. With *convert*, integers and floats are converted
    and empty fields become ``None``. Short rows are padded with ``None``.
    """
    handle = io.StringIO(source) if isinstance(source, str) else source
    rows = [row for row in csv.reader(handle, delimiter=delimiter) if row]
    if not rows:
        raise ValueError("CSV input has no header row")
    headers = [h.strip() for h in rows[0]]
    table = Table(headers)
    for lineno, row in enumerate(rows[1:], start=2):
        if len(row) > len(headers):
            raise ValueError(f"row {lineno} has {len(row)} fields, expected {len(headers)}")
        values = [(_convert(v.strip()) if convert else v) for v in row]
        values.extend([None] * (len(headers) - len(values)))
        table.add_row(values)
    return table


def read_csv_file(path: Union[str, "os.PathLike[str]"], *, encoding: str = "utf-8", **options: Any) -> Table:
    """Read a CSV file; see :func:`read_csv` for *options*."""
    with open(path, encoding=encoding, newline="") as fh:
        return read_csv(fh, **options)


def write_csv(table: Table, *, delimiter: str = ",") -> str:
    """The table as CSV text (``None`` written as an empty field)."""
    out = io.StringIO()
    writer = csv.writer(out, delimiter=delimiter, lineterminator="\n")
    writer.writerow(table.headers)
    for row in table.rows:
        writer.writerow(["" if v is None else v for v in row])
    return out.getvalue()
