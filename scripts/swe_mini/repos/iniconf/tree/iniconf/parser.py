"""Line-based INI parser producing plain dictionaries."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

from .errors import ParseError

Sections = Dict[str, Dict[str, str]]

_COMMENT_CHARS = "#;"
_ESCAPES = {'"': '"', "\\": "\\", "n": "\n", "t": "\t"}


def parse(text: str, source: Optional[str] = None) -> Sections:
    """Parse INI *text* into ``{section: {key: value}}``, in file order.

    Keys are lowercased; section names are kept as written. Values are
    returned uninterpreted except for quote removal; see the README for the
    syntax. Raises :class:`ParseError` with the offending line number.
    """
    sections: Sections = {}
    current: Optional[Dict[str, str]] = None
    current_name = ""
    last_key: Optional[str] = None

    for lineno, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped:
            last_key = None  # a blank line ends a multi-line value
            continue
        if stripped[0] in _COMMENT_CHARS:
            continue
        if line[0].isspace() and last_key is not None and current is not None:
            current[last_key] += "\n" + _strip_inline_comment(stripped).strip()
            continue

        if stripped.startswith("["):
            if not stripped.endswith("]"):
                raise ParseError("unterminated section header", lineno, line, source)
            current_name = stripped[1:-1].strip()
            if not current_name:
                raise ParseError("empty section name", lineno, line, source)
            if current_name in sections:
                raise ParseError(f"duplicate section [{current_name}]", lineno, line, source)
            current = sections[current_name] = {}
            last_key = None
            continue

        if current is None:
            raise ParseError("option outside of any section", lineno, line, source)
        key, value = _split_option(stripped, lineno, line, source)
        if key in current:
            raise ParseError(f"duplicate key {key!r} in [{current_name}]", lineno, line, source)
        current[key] = _parse_value(value, lineno, line, source)
        last_key = key

    return sections


def _split_option(text: str, lineno: int, line: str, source: Optional[str]) -> Tuple[str, str]:
    positions = [pos for pos in (text.find("="), text.find(":")) if pos >= 0]
    if not positions:
        raise ParseError("expected 'key = value'", lineno, line, source)
    pos = min(positions)
    key = text[:pos].strip().lower()
    if not key:
        raise ParseError("empty key", lineno, line, source)
    return key, text[pos + 1 :]


def _strip_inline_comment(value: str) -> str:
    """Cut an inline comment: a comment character preceded by whitespace."""
    for i, ch in enumerate(value):
        if ch in _COMMENT_CHARS and i > 0 and value[i - 1].isspace():
            return value[:i]
    return value


def _parse_value(raw: str, lineno: int, line: str, source: Optional[str]) -> str:
    value = _strip_inline_comment(raw).strip()
    if not value.startswith('"'):
        return value
    if len(value) < 2 or not value.endswith('"') or value.endswith('\\"') and not value.endswith('\\\\"'):
        raise ParseError("unterminated quoted value", lineno, line, source)
    return _unescape(value[1:-1])


def _unescape(text: str) -> str:
    out = []
    chars = iter(text)
    for ch in chars:
        if ch != "\\":
            out.append(ch)
            continue
        nxt = next(chars, "")
        out.append(_ESCAPES.get(nxt, "\\" + nxt))
    return "".join(out)
