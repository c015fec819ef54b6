"""Key names an agent can send to a terminal program, as the bytes a terminal sends.

Names follow tmux's ``send-keys``: ``C-c``, ``C-d``, ``Enter``, ``Escape``, ``Up``...,
so prompts written for tmux-based agents work unchanged.
"""

from __future__ import annotations

_NAMED = {
    "enter": b"\r",  # the terminal turns it into \n for line-reading programs (ICRNL)
    "return": b"\r",
    "tab": b"\t",
    "escape": b"\x1b",
    "esc": b"\x1b",
    "space": b" ",
    "backspace": b"\x7f",
    "bspace": b"\x7f",
    "up": b"\x1b[A",
    "down": b"\x1b[B",
    "right": b"\x1b[C",
    "left": b"\x1b[D",
    "home": b"\x1b[H",
    "end": b"\x1b[F",
    "delete": b"\x1b[3~",
    "dc": b"\x1b[3~",
    "pageup": b"\x1b[5~",
    "ppage": b"\x1b[5~",
    "pagedown": b"\x1b[6~",
    "npage": b"\x1b[6~",
}


def key_bytes(name: str) -> bytes:
    """Bytes for a key name: ``C-<x>`` / ``^<x>`` (control), ``M-<x>`` (meta), or a
    named key. Raises ValueError naming the accepted forms."""
    key = name.strip()
    lowered = key.lower()
    if lowered in _NAMED:
        return _NAMED[lowered]
    if len(key) == 3 and lowered.startswith("c-") or len(key) == 2 and key.startswith("^"):
        char = key[-1]
        if char == "?":
            return b"\x7f"
        code = ord(char.upper())
        if 0x40 <= code <= 0x5F:  # @, A-Z, [, \, ], ^, _
            return bytes([code - 0x40])
    if len(key) == 3 and lowered.startswith("m-"):
        return b"\x1b" + key[-1].encode()
    raise ValueError(
        f"unknown key {name!r}: use C-<letter> (e.g. C-c, C-d), M-<key>, or one of "
        + ", ".join(sorted({k.capitalize() for k in _NAMED}))
    )


def is_key_sequence(text: str) -> bool:
    """True if ``text`` is only key names separated by spaces ("C-c", "Up Enter")."""
    parts = text.split()
    if not parts:
        return False
    try:
        for part in parts:
            key_bytes(part)
    except ValueError:
        return False
    return True
