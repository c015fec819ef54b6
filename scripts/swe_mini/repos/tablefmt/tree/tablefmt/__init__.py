"""tablefmt: render rows as plain-text, Markdown or grid tables."""

from .cells import display_width, is_number
from .csvio import read_csv, read_csv_file, write_csv
from .render import STYLES, render
from .table import Table

__version__ = "0.6.0"

__all__ = [
    "STYLES",
    "Table",
    "display_width",
    "is_number",
    "read_csv",
    "read_csv_file",
    "render",
    "write_csv",
]
