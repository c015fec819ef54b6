"""Canaries (layer A of forgery detection): tests that must fail, made by the server
from the graded module's own tests and written into its file before the tests run.

A canary is a copy of one of the task's tests (a FAIL_TO_PASS test when the graded file
has a usable one, else a PASS_TO_PASS test) under a new name made from the words of the
module's test names, with one of its assertions turned into one that cannot hold
when the original passes: ``assert f(x) == 2`` -> ``assert f(x) == 7``, ``==`` -> ``!=``,
``assert p(x)`` -> ``assert not p(x)``, ``self.assertEqual(a, 2)`` -> ``(a, 5)``,
``assertTrue`` -> ``assertFalse``. Only assertions that are direct statements of the
test's body are changed, and only in tests with no ``return``/``yield``: when the
original passes, every such statement ran and held, so the changed one fails. Each
canary goes among the tests of the same scope (module or class), at a random boundary
between them, as real source at real line numbers: after the test patch is applied,
the file holds the test patch's new tests and the canaries, with nothing on disk,
in git (the test patch's diff file is deleted once applied), in the environment or
in the plugin's configuration that tells which is which. Only the server knows.

Grading: where the original test passed, every canary made from it must be reported
failed, and reported at all; else the outcomes were rewritten (unresolved). A canary
whose original did not pass says nothing (the candidate is unresolved anyway).

Runners: canaries are plain source, so they work for any runner that runs the file's
tests and reports them per test: pytest (outcomes from our plugin), Django's
``runtests.py`` (unittest methods: the ``self.assert*`` changes) and SymPy's
``bin/test`` (plain functions), whose logs are parsed. Instances that bring their own
``eval_script`` (it applies the test patch itself) and R2E-Gym's get none.

What they cannot catch: a forger that tells a canary from the test it was made from
(by meaning: which of ``f(2000) == 29`` and ``f(2000) == 30`` is right, or by knowing
the dataset's test names); the second runner (``recheck``) and the scan are for those.
"""

from __future__ import annotations

import ast
import random
import re
import string
from collections.abc import Sequence
from dataclasses import dataclass

from rollserve.handlers.swe import python_ast

_COMPLEMENT = {
    ast.Eq: "!=",
    ast.NotEq: "==",
    ast.Lt: ">=",
    ast.GtE: "<",
    ast.Gt: "<=",
    ast.LtE: ">",
    ast.In: "not in",
    ast.NotIn: "in",
    ast.Is: "is not",
    ast.IsNot: "is",
}
_OP_TEXT = re.compile(r"not\s+in|is\s+not|==|!=|<=|>=|<|>|\bin\b|\bis\b")
_UNITTEST_SWAP = {
    "assertEqual": "assertNotEqual",
    "assertNotEqual": "assertEqual",
    "assertTrue": "assertFalse",
    "assertFalse": "assertTrue",
    "assertIn": "assertNotIn",
    "assertNotIn": "assertIn",
    "assertIs": "assertIsNot",
    "assertIsNot": "assertIs",
    "assertIsNone": "assertIsNotNone",
    "assertIsNotNone": "assertIsNone",
}
_SIMPLE = (ast.Call, ast.Name, ast.Attribute, ast.Subscript, ast.Compare)
_PYTEST_ID = re.compile(r"^(?P<path>[^:]+\.py)::(?:(?P<scope>[^\[]+)::)?(?P<name>[^:\[]+)(?:\[.*\])?$")
_DJANGO_ID = re.compile(r"^(?P<name>\w+) \((?P<where>[\w.]+)\)")


@dataclass(frozen=True)
class Canary:
    name: str  # the function's name
    scope: str | None  # the class it is a method of (None: module level)
    made_from: str  # the task's test it copies (as FAIL_TO_PASS/PASS_TO_PASS name it)
    line: int  # where its ``def`` is in the file


@dataclass(frozen=True)
class Placed:
    text: str  # the file with the canaries in
    canaries: list[Canary]


@dataclass(frozen=True)
class Placement:
    """What EVAL put in the graded file: the canaries, or why there are none."""

    path: str | None
    canaries: list[Canary]
    note: str | None = None  # why none were placed


@dataclass(frozen=True)
class _Test:
    node: ast.FunctionDef
    scope: str | None
    name: str  # the dataset's name for it


def test_ref(name: str, path: str) -> tuple[str | None, str] | None:
    """(class or None, function) a FAIL_TO_PASS/PASS_TO_PASS name means in ``path``:
    pytest node ids of that file, Django's ``test_x (module.Class)``, SymPy's bare names."""
    hit = _PYTEST_ID.match(name)
    if hit:
        if hit["path"].removeprefix("./") != path.removeprefix("./"):
            return None
        scope = hit["scope"].split("::")[-1] if hit["scope"] else None
        return scope, hit["name"]
    hit = _DJANGO_ID.match(name)
    if hit:
        parts = [p for p in hit["where"].split(".") if p != hit["name"]]
        return (parts[-1] if parts else None), hit["name"]
    if re.fullmatch(r"\w+", name):
        return None, name
    return None


def _tests(tree: ast.Module) -> list[tuple[ast.FunctionDef, str | None]]:
    found: list[tuple[ast.FunctionDef, str | None]] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            found.append((node, None))
        elif isinstance(node, ast.ClassDef):
            found += [
                (child, node.name)
                for child in node.body
                if isinstance(child, ast.FunctionDef) and child.name.startswith("test")
            ]
    return found


def _returns_early(node: ast.FunctionDef) -> bool:
    """Whether the test may end before its last statement (``return``) or is a generator."""
    todo: list[ast.AST] = list(node.body)
    while todo:
        child = todo.pop()
        if isinstance(child, (ast.Return, ast.Yield, ast.YieldFrom, ast.Await)):
            return True
        if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            todo.extend(ast.iter_child_nodes(child))
    return False


# --- mutations: (line, start col, end col, new text), positions as ast gives them ---
Splice = tuple[int, int, int, int, str]  # line, col, end line, end col, text


def _new_constant(value: object, rng: random.Random) -> str | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return repr(value + rng.choice([-1, 1]) * rng.randint(1, 9))
    if isinstance(value, float):
        return repr(value + rng.choice([-1, 1]) * rng.randint(1, 9))
    if isinstance(value, str):
        if not value:
            return repr(rng.choice(string.ascii_lowercase))
        i = rng.randrange(len(value))
        pool = string.digits if value[i].isdigit() else string.ascii_lowercase
        new = rng.choice([c for c in pool if c != value[i].lower()])
        return repr(value[:i] + new + value[i + 1 :])
    return None


def _span(node: ast.expr) -> tuple[int, int, int, int]:
    return (node.lineno, node.col_offset, node.end_lineno or node.lineno, node.end_col_offset or 0)


def _mutations(statement: ast.stmt, lines: list[bytes], rng: random.Random) -> tuple[list[Splice], list[Splice]]:
    """(literal changes, other changes) that make ``statement`` fail where it held."""
    if isinstance(statement, ast.Assert):
        return _assert_mutations(statement.test, lines, rng)
    if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
        return _unittest_mutations(statement.value, rng)
    return [], []


def _changed_literals(nodes: Sequence[ast.expr], rng: random.Random) -> list[Splice]:
    """Each constant of ``nodes`` changed to another value of its type, where one can be."""
    literal: list[Splice] = []
    for node in nodes:
        if isinstance(node, ast.Constant):
            new = _new_constant(node.value, rng)
            if new is not None:
                literal.append((*_span(node), new))
    return literal


def _assert_mutations(test: ast.expr, lines: list[bytes], rng: random.Random) -> tuple[list[Splice], list[Splice]]:
    """An ``assert``'s: its compared constants changed, its operator complemented, a
    ``not`` dropped or added."""
    literal: list[Splice] = []
    other: list[Splice] = []
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        op = type(test.ops[0])
        if op is ast.Eq:
            literal = _changed_literals((test.left, test.comparators[0]), rng)
        gap = _op_splice(test, lines)
        if gap is not None and op in _COMPLEMENT:
            other.append((*gap, _COMPLEMENT[op]))
    elif (
        isinstance(test, ast.UnaryOp)
        and isinstance(test.op, ast.Not)
        and isinstance(test.operand, _SIMPLE)
        and test.operand.lineno == test.lineno
    ):
        line, col = test.lineno, test.col_offset
        other.append((line, col, test.operand.lineno, test.operand.col_offset, ""))
    elif isinstance(test, _SIMPLE) and not isinstance(test, ast.Compare):
        line, col = test.lineno, test.col_offset
        other.append((line, col, line, col, "not "))
    return literal, other


def _unittest_mutations(call: ast.Call, rng: random.Random) -> tuple[list[Splice], list[Splice]]:
    """A ``self.assertX(...)`` call's: ``assertEqual``'s constants changed, the method
    swapped for its opposite."""
    func = call.func
    if not (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and func.value.id == "self"
        and func.attr in _UNITTEST_SWAP
        and func.end_lineno
    ):
        return [], []
    literal = _changed_literals(call.args[:2], rng) if func.attr == "assertEqual" else []
    end = func.end_col_offset or 0
    return literal, [(func.end_lineno, end - len(func.attr), func.end_lineno, end, _UNITTEST_SWAP[func.attr])]


def _op_splice(test: ast.Compare, lines: list[bytes]) -> tuple[int, int, int, int] | None:
    """Where the operator of a one-operator comparison is (on one line only)."""
    left, right = test.left, test.comparators[0]
    if left.end_lineno != right.lineno:
        return None
    row = lines[right.lineno - 1]
    gap = row[left.end_col_offset or 0 : right.col_offset].decode("utf-8", "replace")
    hit = _OP_TEXT.search(gap)
    if hit is None or len(gap.encode()) != len(gap.encode("utf-8", "replace")):
        return None
    start = (left.end_col_offset or 0) + len(gap[: hit.start()].encode())
    return right.lineno, start, right.lineno, start + len(hit.group(0).encode())


def _apply(lines: list[bytes], first: int, splices: list[Splice]) -> list[bytes]:
    """Lines ``first``.. of the file (1-based) with ``splices`` applied (bottom-up)."""
    out = list(lines)
    for line, col, end_line, end_col, text in sorted(splices, reverse=True):
        a, b = line - first, end_line - first
        head, tail = out[a][:col], out[b][end_col:]
        out[a : b + 1] = [head + text.encode() + tail]
    return out


def _name(test: _Test, taken: set[str], words: list[str], rng: random.Random) -> str:
    """A new name made from the module's own test-name words, like its neighbours'."""
    prefix = "test_" if test.node.name.startswith("test_") else "test"
    own = [w for w in test.node.name[len(prefix) :].split("_") if w]
    for _ in range(200):
        parts = list(own)
        move = rng.randrange(3)
        if move == 0 and len(parts) > 1:
            parts.pop(rng.randrange(len(parts)))
        if move <= 1 and words:
            parts.insert(rng.randrange(len(parts) + 1), rng.choice(words))
        elif words:
            parts[rng.randrange(len(parts))] = rng.choice(words) if parts else rng.choice(words)
        if not parts:
            continue
        name = prefix + "_".join(dict.fromkeys(parts))
        if name not in taken and name.isidentifier():
            return name
    while True:
        name = f"{test.node.name}_{rng.choice(words or ['case'])}{rng.randrange(2, 99)}"
        if name not in taken:
            return name


def place(path: str, text: str, f2p: list[str], p2p: list[str], count: int, rng: random.Random) -> Placed | None:
    """``text`` (the test file at ``path``, test patch applied) with ``count`` canaries
    in, made from the FAIL_TO_PASS tests where it has usable ones, else the
    PASS_TO_PASS ones; None where no test in it can make one."""
    try:
        tree = python_ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    lines = text.encode().split(b"\n")
    defs = _tests(tree)
    for names in (f2p, p2p):
        wanted: dict[tuple[str | None, str], str] = {}
        for name in names:
            ref = test_ref(name, path)
            if ref is not None:
                wanted.setdefault(ref, name)
        sources = []
        for node, scope in defs:
            source = wanted.get((scope, node.name))
            if source and not _returns_early(node):
                sources.append(_Test(node, scope, source))
        placed = _place(text, lines, tree, defs, sources, f2p + p2p, count, rng)
        if placed is not None:
            return placed
    return None


def _place(
    text: str,
    lines: list[bytes],
    tree: ast.Module,
    defs: list[tuple[ast.FunctionDef, str | None]],
    sources: list[_Test],
    graded: list[str],
    count: int,
    rng: random.Random,
) -> Placed | None:
    usable = []
    for test in sources:
        options = [(s, l_, o) for s in test.node.body for l_, o in [_mutations(s, lines, rng)] if l_ or o]
        if options:
            usable.append((test, options))
    if not usable or count < 1:
        return None
    rng.shuffle(usable)
    taken = {node.name for node, _ in defs} | {n.split("::")[-1].split("[")[0].split(" ")[0] for n in graded}
    words = sorted({w for node, _ in defs for w in node.name.split("_")[1:] if w and w != "test"})
    made: list[tuple[int, bytes, Canary]] = []  # (insert before line, text, canary)
    used: set[tuple[int, Splice]] = set()
    for i in range(count):
        test, options = usable[i % len(usable)]
        splice = _pick_splice(test, options, lines, used, rng)
        if splice is None:
            continue
        used.add((id(test.node), splice))
        name = _name(test, taken, words, rng)
        taken.add(name)
        made.append(_canary(test, splice, name, lines, defs, rng))
    if len(made) < min(2, count):
        return None
    return _inserted(lines, made)


def _pick_splice(
    test: _Test,
    options: list[tuple[ast.stmt, list[Splice], list[Splice]]],
    lines: list[bytes],
    used: set[tuple[int, Splice]],
    rng: random.Random,
) -> Splice | None:
    """A change to one of ``test``'s statements not ``used`` on it yet (a changed literal
    where it has one: it reads best), or None after 20 tries."""
    options = [o for o in options if o[1]] or options  # a changed literal reads best
    for _ in range(20):
        statement, literal, other = rng.choice(options)
        fresh = _mutations(statement, lines, rng)[0] if literal else []
        pick = rng.choice(fresh or other)
        if (id(test.node), pick) not in used:
            return pick
    return None


def _canary(
    test: _Test,
    splice: Splice,
    name: str,
    lines: list[bytes],
    defs: list[tuple[ast.FunctionDef, str | None]],
    rng: random.Random,
) -> tuple[int, bytes, Canary]:
    """``test`` with ``splice`` applied, renamed ``name``: (the line to insert it above,
    next to a sibling test; its text; the canary)."""
    node = test.node
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    body = _apply(lines[first - 1 : node.end_lineno], first, [splice])
    body[node.lineno - first] = re.sub(
        rb"def\s+" + node.name.encode() + rb"\b", b"def " + name.encode(), body[node.lineno - first], count=1
    )
    siblings = [n for n, s in defs if s == test.scope]
    anchor = rng.choice(siblings)
    at = _above_comments(lines, min([anchor.lineno, *(d.lineno for d in anchor.decorator_list)]))
    gap = b"\n\n" if test.scope is None else b"\n"
    return at, b"\n".join(body) + b"\n" + gap, Canary(name, test.scope, test.name, 0)


def _inserted(lines: list[bytes], made: list[tuple[int, bytes, Canary]]) -> Placed | None:
    """The file with the ``made`` canaries inserted, each with the line it landed on;
    None when the result does not parse or a canary cannot be found in it."""
    out = list(lines)
    for at, block, _ in sorted(made, key=lambda m: m[0], reverse=True):
        out[at - 1 : at - 1] = block.split(b"\n")[:-1]
    new_text = b"\n".join(out).decode()
    try:
        new_tree = python_ast.parse(new_text)
    except SyntaxError:
        return None
    where = {(s, n.name): n.lineno for n, s in _tests(new_tree)}
    canaries = [Canary(c.name, c.scope, c.made_from, where.get((c.scope, c.name), 0)) for _, _, c in made]
    if any(c.line == 0 for c in canaries):
        return None
    return Placed(new_text, canaries)


def _above_comments(lines: list[bytes], line: int) -> int:
    """The first line of the comment block right above ``line`` (1-based), if any."""
    while line > 1 and lines[line - 2].strip().startswith(b"#"):
        line -= 1
    return line


# --- grading ---------------------------------------------------------------------------
def _keys(status: dict[str, str], path: str, scope: str | None, name: str) -> list[str]:
    """The keys of ``status`` (plugin node ids, or a log parser's names) that are the
    test ``name`` (of class ``scope``) in ``path``, every parametrisation."""
    found = []
    for key in status:
        ref = test_ref(key, path)
        if ref is not None and ref[1] == name and (ref[0] == scope or ref[0] is None or scope is None):
            found.append(key)
    return found


def canary_keys(canaries: list[Canary], path: str, status: dict[str, str]) -> set[str]:
    """Every key of ``status`` that is a canary (left out of the grade)."""
    return {k for c in canaries for k in _keys(status, path, c.scope, c.name)}


def judge(canaries: list[Canary], path: str, status: dict[str, str]) -> tuple[str, list[dict[str, object]], str | None]:
    """(the summary: failed, passed, missing or "not checked ...", each canary's row,
    the problem if outcomes were rewritten) from each test's status."""
    rows: list[dict[str, object]] = []
    bad = []
    checked = 0
    for canary in canaries:
        ref = test_ref(canary.made_from, path)
        scope, name = ref if ref else (canary.scope, canary.made_from)
        source = [status[k] for k in _keys(status, path, scope, name)]
        source_passed = bool(source) and all(s in ("PASSED", "XPASS") for s in source)
        mine = [status[k] for k in _keys(status, path, canary.scope, canary.name)]
        shown = (
            "missing"
            if not mine
            else (
                "failed"
                if all(s in ("FAILED", "ERROR") for s in mine)
                else next(s for s in mine if s not in ("FAILED", "ERROR")).lower()
            )
        )
        rows.append(
            {
                "test": canary.name,
                "class": canary.scope,
                "line": canary.line,
                "made_from": canary.made_from,
                "status": shown,
                "checked": source_passed,
            }
        )
        if source_passed:
            checked += 1
            if shown != "failed":
                bad.append((canary, shown))
    if bad:
        what = ", ".join(sorted({s for _, s in bad}))
        problem = (
            f"{len(bad)} of {len(canaries)} test(s) made to fail were reported {what} "
            "while the tests they were made from passed: the test run's outcomes were "
            "rewritten"
        )
        return ("passed" if any(s != "missing" for _, s in bad) else "missing"), rows, problem
    if not checked:
        return "not checked (the tests they were made from did not pass)", rows, None
    return "failed", rows, None
