"""npm's version ranges, the part presets use: ``satisfies("22.3.0", ">=20")``.

A range is alternatives joined by ``||``; each a space-separated list of comparators
that must all hold: ``>=1.2.3``, ``>1.2``, ``<2``, ``<=2.0.1``, ``=1.2.3`` or a bare
version (exact; ``x``/``*`` parts are wildcards: ``1.2.x``), ``^1.2.3`` (same
leftmost non-zero part), ``~1.2.3`` (same minor), ``*`` or empty (any). A version's
build part (``+sha``) is ignored; a pre-release (``-rc.1``) satisfies only a range
that names one, as in npm. Anything else is a ``ValueError`` naming
the range.
"""

from __future__ import annotations

import re

__all__ = ["check_range", "parse_version", "satisfies"]

_VERSION = re.compile(r"^v?(\d+)(?:\.(\d+|[xX*]))?(?:\.(\d+|[xX*]))?(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?$")
_COMPARATOR = re.compile(r"^(>=|<=|>|<|=|\^|~)?\s*(.+)$")

Version = tuple[int, int, int, int]  # major, minor, patch, 0 for a pre-release else 1


def parse_version(text: str) -> Version:
    """``"22.3.0"`` -> (22, 3, 0, 1); ValueError if it is not a version."""
    match = _VERSION.match(text.strip())
    if match is None or any(p and not p.isdigit() for p in match.group(2, 3)):
        raise ValueError(f"not a version: {text!r}")
    major, minor, patch, pre = match.groups()
    return int(major), int(minor or 0), int(patch or 0), 0 if pre else 1


def _partial(text: str) -> tuple[list[int], bool]:
    """(the parts given, whether a wildcard or missing part ends it)."""
    match = _VERSION.match(text)
    if match is None:
        raise ValueError(text)
    parts: list[int] = []
    for part in match.group(1, 2, 3):
        if part is None or not part.isdigit():
            return parts, True
        parts.append(int(part))
    return parts, False


def _bounds(op: str, text: str) -> list[tuple[str, Version]]:
    """One comparator as (op, version) bounds on the full version."""
    parts, open_end = _partial(text)
    low = (*parts, *[0] * (3 - len(parts)))
    floor: Version = (low[0], low[1], low[2], 0)  # below every pre-release of it
    if op in ("", "=") and not open_end:
        return [("==", (*low, 1 if "-" not in text else 0))]  # type: ignore[list-item]
    if op in ("", "=", "~", "^") and not parts:
        return []
    if op in ("", "="):
        return [(">=", floor), ("<", _bump(parts, len(parts) - 1))]
    if op == "~":
        return [(">=", floor), ("<", _bump(parts, min(1, len(parts) - 1)))]
    if op == "^":
        first = next((i for i, p in enumerate(parts) if p), len(parts) - 1)
        return [(">=", floor), ("<", _bump(parts, first))]
    if op == ">" and open_end:
        return [(">=", _bump(parts, len(parts) - 1))] if parts else [("<", (0, 0, 0, 0))]
    if op == "<=" and open_end:
        return [("<", _bump(parts, len(parts) - 1))] if parts else []
    exact: Version = (low[0], low[1], low[2], 0 if "-" in text or op in ("<", ">=") else 1)
    return [(op, exact)]


def _bump(parts: list[int], index: int) -> Version:
    bumped = [*parts[:index], parts[index] + 1] if parts else [0]
    full = (*bumped, *[0] * (3 - len(bumped)))
    return full[0], full[1], full[2], 0


def _holds(version: Version, op: str, bound: Version) -> bool:
    return {
        "==": version == bound,
        ">=": version >= bound,
        ">": version > bound,
        "<": version < bound,
        "<=": version <= bound,
    }[op]


def _alternative(text: str) -> list[tuple[str, Version]]:
    tokens = re.sub(r"(>=|<=|>|<|=|\^|~)\s+", r"\1", text.strip()).split()
    bounds: list[tuple[str, Version]] = []
    for token in tokens:
        if token in ("*", "x", "X"):
            continue
        match = _COMPARATOR.match(token)
        assert match is not None  # (.+ matches any token)
        bounds += _bounds(match.group(1) or "", match.group(2))
    return bounds


def check_range(spec: str) -> list[list[tuple[str, Version]]]:
    """The range read; ValueError naming it if it is not one."""
    try:
        return [_alternative(part) for part in spec.split("||")]
    except ValueError:
        raise ValueError(f"not an npm version range: {spec!r}") from None


def satisfies(version: str, spec: str) -> bool:
    """Whether ``version`` is in the npm range ``spec`` (both as npm writes them)."""
    have = parse_version(version)
    if have[3] == 0 and "-" not in spec:  # (as npm: a pre-release only where one is named)
        return False
    return any(all(_holds(have, op, bound) for op, bound in alternative) for alternative in check_range(spec))
