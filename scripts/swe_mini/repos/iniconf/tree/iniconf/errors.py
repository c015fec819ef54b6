"""Exceptions raised by iniconf."""

from __future__ import annotations

from typing import Optional


class IniconfError(Exception):
    """Base class of every iniconf error."""


class ParseError(IniconfError):
    """The text is not valid INI. ``lineno`` is 1-based."""

    def __init__(self, message: str, lineno: int, line: str = "", source: Optional[str] = None) -> None:
        self.message = message
        self.lineno = lineno
        self.line = line
        self.source = source
        where = f"{source}:{lineno}" if source else f"line {lineno}"
        super().__init__(f"{where}: {message}")


class MissingOptionError(IniconfError, KeyError):
    """The requested section or key does not exist."""

    def __init__(self, section: str, key: Optional[str] = None) -> None:
        self.section = section
        self.key = key
        what = f"[{section}] {key}" if key is not None else f"section [{section}]"
        super().__init__(f"no such option: {what}")

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class InterpolationError(IniconfError):
    """A ``${...}`` reference cannot be resolved."""


class ConversionError(IniconfError, ValueError):
    """A value cannot be converted to the requested type."""
