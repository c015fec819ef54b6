"""The :class:`Config` object: typed access to parsed INI data."""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Optional, TypeVar, Union

from . import convert
from .errors import MissingOptionError
from .interpolate import expand
from .parser import Sections, parse

DEFAULT_SECTION = "DEFAULT"

T = TypeVar("T")
_MISSING: Any = object()


class Config:
    """Parsed configuration.

    Options of the ``DEFAULT`` section are visible from every other section
    unless the section sets them itself.
    """

    def __init__(self, sections: Sections, source: Optional[str] = None) -> None:
        sections = dict(sections)
        self._defaults = sections.pop(DEFAULT_SECTION, {})
        self._sections = sections
        self.source = source

    # -- structure ------------------------------------------------------

    def sections(self) -> List[str]:
        """Section names in file order, without ``DEFAULT``."""
        return list(self._sections)

    def has_section(self, section: str) -> bool:
        return section in self._sections

    def options(self, section: str) -> List[str]:
        """Keys visible in *section*, including inherited defaults."""
        own = self._section(section)
        return list(own) + [key for key in self._defaults if key not in own]

    def has_option(self, section: str, key: str) -> bool:
        return self._raw(section, key.lower()) is not None

    # -- values -----------------------------------------------------------

    def get(self, section: str, key: str, default: Any = _MISSING, *, raw: bool = False) -> str:
        """Return the value of *key* in *section*, with references expanded.

        Without a *default*, a missing option raises :class:`MissingOptionError`.
        """
        self._section(section)  # raises for an unknown section
        key = key.lower()
        value = self._raw(section, key)
        if value is None:
            if default is _MISSING:
                raise MissingOptionError(section, key)
            return default
        return value if raw else expand(value, section, self._raw)

    def get_int(self, section: str, key: str, default: Any = _MISSING) -> int:
        return self._typed(section, key, default, convert.to_int)

    def get_float(self, section: str, key: str, default: Any = _MISSING) -> float:
        return self._typed(section, key, default, convert.to_float)

    def get_bool(self, section: str, key: str, default: Any = _MISSING) -> bool:
        return self._typed(section, key, default, convert.to_bool)

    def get_list(self, section: str, key: str, default: Any = _MISSING, sep: str = ",") -> List[str]:
        return self._typed(section, key, default, lambda value: convert.to_list(value, sep))

    def items(self, section: str) -> Dict[str, str]:
        """All options visible in *section*, expanded."""
        return {key: self.get(section, key) for key in self.options(section)}

    def __getitem__(self, section: str) -> Dict[str, str]:
        return self.items(section)

    def __contains__(self, section: object) -> bool:
        return section in self._sections

    # -- internals --------------------------------------------------------

    def _section(self, section: str) -> Dict[str, str]:
        if section == DEFAULT_SECTION:
            return self._defaults
        try:
            return self._sections[section]
        except KeyError:
            raise MissingOptionError(section) from None

    def _raw(self, section: str, key: str) -> Optional[str]:
        own = self._defaults if section == DEFAULT_SECTION else self._sections.get(section)
        if own is None:
            return None
        if key in own:
            return own[key]
        return self._defaults.get(key)

    def _typed(self, section: str, key: str, default: Any, conv: Callable[[str], T]) -> Union[T, Any]:
        value = self.get(section, key, _MISSING if default is _MISSING else None)
        if value is None:
            return default
        return conv(value)


def loads(text: str, source: Optional[str] = None) -> Config:
    """Parse INI text."""
    return Config(parse(text, source), source)


def load(path: Union[str, "os.PathLike[str]"], encoding: str = "utf-8") -> Config:
    """Read and parse the INI file at *path*."""
    with open(path, encoding=encoding) as fh:
        return loads(fh.read(), source=os.fspath(path))
