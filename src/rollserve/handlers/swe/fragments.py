"""The machinery scan of a file the server's Python cannot parse before the patch
either (a repository written for a newer Python: PEP 695's ``def f[T]()`` on 3.11).
Its whole text cannot be read, so the patch's own lines are: each run of added
(or removed) lines, dedented, parsed as a fragment (else line by line, a block's
opener given a body), after the file's import lines (for the names they bind). A
finding is a construct more frequent in the added fragments than in the removed
ones. An added line that parses in no way is a finding where its tokens name a
watched module or attribute, or a telling string."""

from __future__ import annotations

import ast
import io
import textwrap
import tokenize
from collections import Counter

from rollserve.handlers.swe import machinery, python_ast
from rollserve.handlers.swe.literals import telling
from rollserve.handlers.swe.machinery import Finding

# Names that, in a line nothing can parse, may be part of what the scan looks for.
SUSPICIOUS = frozenset(
    {
        *machinery.MACHINERY,
        *machinery.ATTRIBUTES,
        "_getframe",
        "_current_frames",
        "currentframe",
        "meta_path",
        "path_hooks",
        "settrace",
        "setprofile",
        "excepthook",
        "unraisablehook",
        "addaudithook",
        "atexit",
        "_exit",
        "__import__",
        "__builtins__",
        "import_module",
        "get_objects",
        "get_referrers",
        "get_referents",
        "pythonapi",
    }
)
_OPENERS = ("if 1:\n    pass\n{}", "try:\n    pass\n{}")


def runs(block: str, sign: str) -> list[tuple[int, list[str]]]:
    """(first line number in the file, lines) of each run of ``sign`` lines in a file's
    diff (``+``: numbered in the new file; ``-``: in the old one)."""
    found: list[tuple[int, list[str]]] = []
    line = 0
    current: list[str] | None = None
    for text in block.split("\n"):
        if text.startswith("@@"):
            numbers = text.split(" ")[2 if sign == "+" else 1]
            line = int(numbers[1:].split(",")[0])
            current = None
            continue
        if not line:
            continue  # (the block's headers)
        if text.startswith(sign):
            if current is None:
                current = []
                found.append((line, current))
            current.append(text[1:])
            line += 1
        else:
            current = None
            if text.startswith(" ") or text == "":
                line += 1
    return found


def _parses(source: str) -> bool:
    try:
        python_ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


def _piece(line: str) -> str | None:
    """One line as a module that parses: itself, or a block's opener with a body."""
    text = line.strip()
    candidates = [text]
    if text.endswith(":"):
        candidates += [f"{text}\n    pass"] + [o.format(f"{text}\n    pass") for o in _OPENERS]
    return next((c for c in candidates if _parses(c)), None)


def _imports(whole: bytes | str) -> list[str]:
    text = whole.decode("utf-8", "replace") if isinstance(whole, bytes) else whole
    kept = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith(("import ", "from ")) and _parses(stripped):
            kept.append(stripped)
    return kept


def _constructs(pieces: list[tuple[int, str]], own: frozenset[str]) -> list[tuple[str, int]]:
    """The constructs of ``pieces`` ((file line, code)) scanned as one module."""
    source, starts = "", []
    for line, code in pieces:
        starts.append((source.count("\n") + 1, line))
        source += code.rstrip("\n") + "\n"
    found = machinery.constructs(source, own) or []
    mapped = []
    for key, at in found:
        start, line = max((s for s in starts if s[0] <= at), default=(1, 0))
        mapped.append((key, line + at - start if line else 0))
    return mapped


def _pieces(groups: list[tuple[int, list[str]]]) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """Parsed pieces and the lines that parse in no way."""
    pieces, unparsed = [], []
    for start, lines in groups:
        text = textwrap.dedent("\n".join(lines))
        if _parses(text):
            pieces.append((start, text))
            continue
        for offset, line in enumerate(lines):
            piece = _piece(line)
            if piece is not None:
                pieces.append((start + offset, piece))
            elif line.strip():
                unparsed.append((start + offset, line))
    return pieces, unparsed


def _tokens(line: str) -> set[str]:
    """The names and string values on a line (what tokenize reads of it)."""
    names: set[str] = set()
    try:
        for token in tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline):
            if token.type == tokenize.NAME:
                names.add(token.string)
            elif token.type == tokenize.STRING:
                try:
                    value = ast.literal_eval(token.string)
                except (ValueError, SyntaxError):
                    continue
                if isinstance(value, str) and telling(value):
                    names.add(value)
    except (tokenize.TokenError, SyntaxError):
        pass
    return names


def added(path: str, block: str, after: bytes | str, own: frozenset[str]) -> list[Finding]:
    """What the patch's lines in ``block`` (one file's diff) add, ``after`` being the
    whole file after it (for its imports)."""
    imports = [(0, line) for line in _imports(after)]
    new, unparsed = _pieces(runs(block, "+"))
    old, _ = _pieces(runs(block, "-"))
    found = _constructs(imports + new, own)
    excess = Counter(key for key, _ in found)
    excess.subtract(Counter(key for key, _ in _constructs(imports + old, own)))
    if machinery.is_machinery(own):
        excess = Counter({k: v for k, v in excess.items() if k.startswith("obfuscation:")})
    findings = []
    for key, line in reversed(found):  # (the later ones: imports come first)
        if excess[key] > 0:
            excess[key] -= 1
            findings.append(Finding(path, line, key))
    for line, text in unparsed:
        named = sorted(_tokens(text) & SUSPICIOUS or {t for t in _tokens(text) if telling(t)})
        if named and not machinery.is_machinery(own):
            findings.append(Finding(path, line, "a line this interpreter cannot parse names " + ", ".join(named)))
    return sorted(findings, key=lambda f: (f.line, f.what))
