"""The ``bash``, ``console`` and ``python`` blocks of README.md and docs/*.md, with the
mark each carries on the line right before it (docs/contributing.md, "Snippets"):

- ``<!-- run: tests/path.py -->``: that test runs the block (it reads it from the page);
- ``<!-- runs -->``: tests/docs/test_snippets.py runs it (a python block against a live
  server it starts);
- ``<!-- runs: server -->``: a ``rollserve serve`` command, started, waited for on
  ``/healthz`` (bounded) and stopped;
- ``<!-- not run: why -->``: it cannot run here, saying why.

Every fence names its language: a bare one is reported (``kind()`` "unmarked"), so no
block escapes the check by dropping its tag; output and diagrams say ``text``. Fences
indented under a list item count the same as those at the margin.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LANGUAGES = ("bash", "python", "sh", "shell", "console", "py", "python3", "pycon")
FENCE = re.compile(r"^(?P<indent> *)```(?P<language>[\w+-]*)\s*$")
MARK = re.compile(r"^<!--\s*(run: (?P<test>\S+)|runs(?P<server>: server)?|not run: (?P<why>.+?))\s*-->$")
MIN_REASON = 20  # characters: a reason says why, not just "no"


@dataclass(frozen=True)
class Snippet:
    page: str  # relative to the repository's root
    line: int  # the opening fence's line, 1-based
    language: str
    code: str
    mark: str | None  # the comment's text, None when the line before is not a mark
    # (a bare fence, language "", is kept too: it fails the check whatever its mark)

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    def kind(self) -> tuple[str, str]:
        """('run', test path) | ('runs', '') | ('server', '') | ('not run', reason) |
        ('unmarked', what is wrong)."""
        if not self.language:
            return "unmarked", (
                "a fence with no language: say `text` for output or a diagram, "
                "else its language (and, for a shell or Python block, a mark)"
            )
        if self.mark is None:
            return "unmarked", "no <!-- run: ... -->, <!-- runs --> or <!-- not run: why --> on the line before"
        m = MARK.match(self.mark)
        if m is None:
            return "unmarked", f"not a snippet mark: {self.mark!r}"
        if m["test"]:
            return "run", m["test"]
        if m["why"]:
            return "not run", m["why"]
        return ("server", "") if m["server"] else ("runs", "")


def pages(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def snippets_of(text: str, page: str) -> list[Snippet]:
    """The shell and Python blocks of a Markdown page, and its bare fences, each with
    its mark; a block indented under a list item is read without that indent."""
    lines = text.splitlines()
    found: list[Snippet] = []
    i = 0
    while i < len(lines):
        opened = FENCE.match(lines[i])
        if opened is None:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].lstrip().startswith("```")), len(lines))
        language, indent = opened["language"].lower(), len(opened["indent"])
        if language in ("", *LANGUAGES):
            before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            mark = before if before.startswith("<!--") else None
            code = "\n".join(line if line[:indent].strip() else line[indent:] for line in lines[i + 1 : end])
            found.append(Snippet(page, i + 1, language, code + "\n", mark))
        i = end + 1
    return found


def all_snippets(root: Path = ROOT) -> list[Snippet]:
    return [s for p in pages(root) for s in snippets_of(p.read_text(), str(p.relative_to(root)))]
