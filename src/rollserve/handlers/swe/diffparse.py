"""A strict reader of ``git diff`` output: each file's block, the paths it names and
whether it creates them, read the way ``git apply -p1`` and ``patch -p1`` will.

The hunks are followed by their line counts (``@@ -a,b +c,d @@``): a ``---``/``+++``
pair or any other line after a hunk's last line is not the file's content, and both
tools would read it as another file's header. So nothing is skipped: every line is a
known header line, a hunk header, or one of a hunk's counted lines, and a block that
has anything else (text the parser cannot attribute, counts that do not add up, a
binary patch, a path without its ``a/``/``b/`` prefix or that differs between the
block's headers) carries a ``problem`` and is never trusted.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass, field

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
# Extended header lines git writes between "diff --git" and the first hunk.
_PLAIN = (
    "old mode ",
    "new mode ",
    "deleted file mode ",
    "new file mode ",
    "index ",
    "similarity index ",
    "dissimilarity index ",
)
_NAMED = ("rename from ", "rename to ", "copy from ", "copy to ")


def unquote(name: str) -> str:
    """A path as git writes it in a diff: C-quoted (``"a/t\\303\\251st.py"``) when it has
    unusual characters; a trailing tab when it has spaces."""
    name = name.removesuffix("\t")
    if len(name) >= 2 and name[0] == name[-1] == '"':
        raw = codecs.escape_decode(name[1:-1].encode("utf-8", "surrogateescape"))[0]
        return raw.decode("utf-8", "surrogateescape")
    return name


def header_paths(rest: str) -> list[str]:
    """Both paths of a ``diff --git A B`` header: quoted ones, or ``a/X b/X``; [] when
    they cannot be told apart (unquoted names with spaces that differ)."""
    quoted = re.findall(r'"(?:[^"\\]|\\.)*"|[^" ]+', rest)
    if '"' in rest:
        return [unquote(q) for q in quoted] if len(quoted) == 2 else []
    half = (len(rest) - 1) // 2
    if len(rest) > 2 and rest[half] == " " and rest[2:half] == rest[half + 3 :]:
        return [rest[:half], rest[half + 1 :]]
    return []


@dataclass
class FileDiff:
    text: str = ""  # the block, as it will be applied
    paths: list[str] = field(default_factory=list)  # every path it names, without a/ b/
    created: list[str] = field(default_factory=list)  # the paths it makes (new, renamed to)
    problems: list[str] = field(default_factory=list)  # why it cannot be trusted


def _strip(path: str, prefix: str, block: FileDiff) -> str | None:
    """``path`` without the prefix ``-p1`` removes; a problem if it lacks it."""
    if path == "/dev/null":
        return None
    if not path.startswith(prefix):
        block.problems.append(f"a path without its {prefix} prefix: {path!r}")
        return path
    return path[len(prefix) :]


class _Reader:
    """Walks the lines of one diff; ``blocks`` is the result."""

    def __init__(self) -> None:
        self.blocks: list[FileDiff] = []
        self.old: int = 0  # lines still due in the current hunk
        self.new: int = 0
        self.in_header = False  # between "diff --git" and the first hunk
        self.last: str = ""  # the previous line's kind: header, hunk, line, end
        self.sides: dict[str, str | None] = {}  # the block's paths by where they came from
        self.empty_old = True  # every hunk starts from an empty old file

    def start(self, line: str) -> None:
        self.finish()
        block = FileDiff()
        self.blocks.append(block)
        self.in_header, self.old, self.new, self.last, self.empty_old = True, 0, 0, "header", True
        self.sides = {}
        paths = header_paths(line.removeprefix("diff --git ").rstrip("\n"))
        if paths:
            self.sides["diff a"] = _strip(paths[0], "a/", block)
            self.sides["diff b"] = _strip(paths[1], "b/", block)

    def finish(self) -> None:
        """Check the finished block's paths agree and record them."""
        if not self.blocks:
            return
        block = self.blocks[-1]
        if self.old or self.new:
            block.problems.append(f"a hunk ends {self.old} old and {self.new} new lines short")
        names = {where: path for where, path in self.sides.items() if path is not None}
        old = {p for w, p in names.items() if w in ("diff a", "---", "rename from", "copy from")}
        new = {p for w, p in names.items() if w in ("diff b", "+++", "rename to", "copy to")}
        if len(old) > 1 or len(new) > 1:
            block.problems.append(f"headers that name different files: {sorted(old | new)}")
        if not names:
            block.problems.append("no readable path")
        block.paths = list(dict.fromkeys([*sorted(old), *sorted(new), *names.values()]))
        creates = (
            self.sides.get("---", "") is None
            or "new file" in self.sides
            or "rename to" in self.sides
            or "copy to" in self.sides
            or (self.last != "header" and self.empty_old)
        )
        if creates:  # (a hunk from line 0 makes a file the tools find missing or empty)
            block.created = sorted(new or old)

    def header(self, line: str, block: FileDiff) -> None:
        text = line.rstrip("\n")
        if text.startswith(("--- ", "+++ ")):
            where = text[:3]
            if where in self.sides:
                block.problems.append(f"a second {where} line: {text[:200]!r}")
            self.sides[where] = _strip(unquote(text[4:]), "a/" if where == "---" else "b/", block)
        elif text.startswith(_NAMED):
            marker = next(m for m in _NAMED if text.startswith(m))
            if marker.strip() in self.sides:
                block.problems.append(f"a second {marker.strip()} line: {text[:200]!r}")
            self.sides[marker.strip()] = unquote(text[len(marker) :])
        elif text.startswith("new file mode "):
            self.sides["new file"] = None
        elif text.startswith(_PLAIN):
            pass
        elif text.startswith(("Binary files ", "GIT binary patch")):
            block.problems.append("a binary patch")
        else:
            block.problems.append(f"a line that is not a diff header: {text[:200]!r}")

    def line(self, line: str) -> None:
        if line.startswith("diff --git "):
            if self.old or self.new:  # inside a hunk: the counts do not add up
                self.blocks[-1].problems.append(f"a file header inside a hunk: {line[:200]!r}")
            else:
                self.start(line)
                self.blocks[-1].text += line
                return
        block = self.blocks[-1]
        block.text += line
        hunk = _HUNK.match(line)
        if self.old or self.new:
            self.counted(line, block)
        elif hunk and (self.in_header or self.last in ("line", "end")):
            self.in_header, self.last = False, "hunk"
            self.old = 1 if hunk[2] is None else int(hunk[2])
            self.new = 1 if hunk[4] is None else int(hunk[4])
            self.empty_old = self.empty_old and self.old == 0 and int(hunk[1]) == 0
            if not self.old and not self.new:
                block.problems.append(f"an empty hunk: {line[:200]!r}")
        elif self.in_header:
            self.header(line, block)
        elif line.startswith("\\") and self.last == "line":
            self.last = "end"  # "\ No newline at end of file"
        elif not any(p.startswith("text after a hunk") for p in block.problems):
            block.problems.append(f"text after a hunk that belongs to no hunk: {line[:200]!r}")

    def counted(self, line: str, block: FileDiff) -> None:
        kind = line[:1]
        if kind in (" ", "\n"):  # ("\n": an empty context line, as both tools read it)
            self.old, self.new = self.old - 1, self.new - 1
        elif kind == "-":
            self.old -= 1
        elif kind == "+":
            self.new -= 1
        elif kind == "\\" and self.last == "line":
            self.last = "end"
            return
        else:
            block.problems.append(f"a line in a hunk that is not a hunk line: {line[:200]!r}")
            self.old = self.new = 0
            return
        self.last = "line"
        if self.old < 0 or self.new < 0:
            block.problems.append("a hunk longer than its header says")
            self.old = self.new = 0


def parse(patch: str) -> tuple[str, list[FileDiff]]:
    """The text before the first ``diff --git`` line, and each file's block."""
    lines = patch.split("\n")
    lines = [line + "\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])
    preamble: list[str] = []
    reader = _Reader()
    for line in lines:
        if not reader.blocks and not line.startswith("diff --git "):
            preamble.append(line)
        else:
            reader.line(line)
    reader.finish()
    return "".join(preamble), reader.blocks
