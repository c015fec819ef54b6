"""Turning raw terminal/process output into text a model can read.

Shared by the bash and IPython tools: strip ANSI escape sequences and carriage-return
noise, and keep the head and the tail of huge outputs (the end of a build log and
its first error are what matter) without ever holding the whole flood in memory.
"""

from __future__ import annotations

import re

# CSI (colours, cursor moves), OSC (window titles; ended by BEL or ESC \), charset
# selection, and the remaining two-byte escapes.
_ANSI = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
    r"|\x1b[()*+][0-9A-Za-z]"
    r"|\x1b[@-Z\\-_=>78]"
    r"|\x9b[0-?]*[ -/]*[@-~]"
)
# Everything but \n and \t that a terminal would not print (BEL, NUL, DEL, ...).
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_BACKSPACED = re.compile(r"[^\n\x08]\x08")  # "x\bx" bold / overstrike from man pages


def clean_terminal_text(text: str) -> str:
    """``text`` as a reader of the terminal would see it: no escape sequences, each
    line showing what a ``\\r`` overwrite (progress bars) left last, no control bytes."""
    text = _ANSI.sub("", text)
    if "\x08" in text:
        while True:
            stripped = _BACKSPACED.sub("", text)
            if stripped == text:
                break
            text = stripped
    if "\r" in text:
        text = text.replace("\r\n", "\n")
        # A lone \r returns the cursor: what was written after the last one wins.
        # (Longer earlier text would still show at the end of the line on a real
        # terminal; progress bars pad, so "last segment" is the readable answer.)
        text = "\n".join(_last_nonempty_segment(line) for line in text.split("\n"))
    return _CONTROL.sub("", text)


def _last_nonempty_segment(line: str) -> str:
    if "\r" not in line:
        return line
    for segment in reversed(line.split("\r")):
        if segment:
            return segment
    return ""


def truncation_note(dropped: int, unit: str = "bytes") -> str:
    return f"\n[... {dropped} {unit} of output dropped (head and tail kept) ...]\n"


def truncate_middle(text: str, limit: int) -> tuple[str, int]:
    """``text`` cut to about ``limit`` characters, keeping the head and the tail;
    returns the text (with a note where it was cut) and how many characters went."""
    if len(text) <= limit:
        return text, 0
    head = limit // 2
    tail = limit - head
    dropped = len(text) - head - tail
    return text[:head] + truncation_note(dropped, "characters") + text[-tail:], dropped


class HeadTail:
    """Bytes of a stream, keeping the first ``head`` and the last ``tail`` bytes only.

    Memory stays bounded however much a command prints (``yes`` writes ~100 MB/s to a
    PTY); ``total`` still counts every byte, so the note can say how many were dropped.
    """

    def __init__(self, head: int, tail: int):
        self.head_limit = head
        self.tail_limit = tail
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def append(self, data: bytes) -> None:
        self.total += len(data)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
            if not data:
                return
        self.tail += data
        excess = len(self.tail) - self.tail_limit
        if excess > 0:
            del self.tail[:excess]

    @property
    def dropped(self) -> int:
        return self.total - len(self.head) - len(self.tail)

    def text(self) -> str:
        """Decoded, cleaned text with a note where bytes were dropped."""
        if not self.dropped:  # decode as one: the split may cut a character in two
            return clean_terminal_text(bytes(self.head + self.tail).decode("utf-8", "replace"))
        head = clean_terminal_text(self.head.decode("utf-8", "replace"))
        tail = clean_terminal_text(self.tail.decode("utf-8", "replace"))
        return head + truncation_note(self.dropped) + tail
