"""tablefmt: render rows as plain-text, Markdown or grid tables."""

from .cells import display_width, is_number
from .render import STYLES, render
from .table import Table

__version__ = "0.5.0"

__all__ = ["STYLES", "Table", "display_width", "is_number", "render"]
