"""iniconf: a small, strict INI configuration reader."""

from .errors import IniconfError, ParseError
from .parser import parse

__version__ = "0.5.0"

__all__ = ["IniconfError", "ParseError", "parse"]
