"""iniconf: a small, strict INI configuration reader."""

from .config import Config, load, loads
from .errors import ConversionError, IniconfError, InterpolationError, MissingOptionError, ParseError

__version__ = "0.5.0"

__all__ = [
    "Config",
    "ConversionError",
    "IniconfError",
    "InterpolationError",
    "MissingOptionError",
    "ParseError",
    "load",
    "loads",
]
