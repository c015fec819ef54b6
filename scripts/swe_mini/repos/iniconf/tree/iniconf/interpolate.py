"""``${key}`` / ``${section:key}`` references inside values."""

from __future__ import annotations

import re
from typing import Callable, Optional

from .errors import InterpolationError

_REFERENCE = re.compile(r"\$(?:\$|\{([^}:]*)(?::([^}]*))?\})")

# (section, key) -> raw value, or None when the option does not exist.
Lookup = Callable[[str, str], Optional[str]]


def expand(value: str, section: str, lookup: Lookup) -> str:
    """Expand every reference in *value*, which belongs to *section*.

    ``${key}`` refers to *key* of the same section, ``${other:key}`` to a key of
    section *other*; referenced values are expanded in turn. ``$$`` is a
    literal dollar sign.
    """

    def replace(match: "re.Match[str]") -> str:
        if match.group(0) == "$$":
            return "$"
        first, second = match.group(1), match.group(2)
        if second is None:
            ref_section, ref_key = section, first
        else:
            ref_section, ref_key = first, second
        ref_key = ref_key.strip().lower()
        if not ref_key:
            raise InterpolationError(f"empty reference in {value!r}")
        raw = lookup(ref_section, ref_key)
        if raw is None:
            raise InterpolationError(f"[{section}]: reference to missing option ${{{ref_section}:{ref_key}}}")
        return expand(raw, ref_section, lookup)

    return _REFERENCE.sub(replace, value)
