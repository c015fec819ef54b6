"""docs/architecture.md's import table is the one list of what each part of
``src/rollserve`` may import of the others, and this holds the code to it.

Every import statement in ``src/`` is read with ``ast`` (anywhere in a file: under
``TYPE_CHECKING`` and inside functions too; relative imports resolved; ``from pkg import
module`` counted as the module), and one the table does not allow fails naming its
``file:line`` and the row. The table itself must name only modules that exist and give
every part of ``src/`` a row, so the document cannot rot. (llm's insides have their own
arrows and cycle check: ``tests/llm/test_layering.py``; both read imports through
``tests.source_ast.import_statements``.)

A lazy face (a package's ``__init__.py`` with ``_HOMES``, see ``rollserve/faces.py``)
imports its names at run time from the module strings in ``_HOMES``: those count as its
imports here, and its three lists (``TYPE_CHECKING`` imports, ``_HOMES``, ``__all__``)
must agree."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import rollserve
from tests.source_ast import ImportStatement, import_statements, parse_source

SRC = Path(rollserve.__file__).parent
ROOT = SRC.parent.parent
DOC = ROOT / "docs" / "architecture.md"
HEADING = "### The import table"


def module_name(path: Path, src: Path = SRC) -> str:
    parts = list(path.relative_to(src.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(src: Path = SRC) -> dict[str, Path]:
    return {module_name(p, src): p for p in sorted(src.rglob("*.py"))}


def parts_of_src(src: Path = SRC) -> set[str]:
    """A row's name for every part: each package (a folder with an ``__init__.py``) and
    each top-level module (``server.py``, ``__init__.py``, ...)."""
    return {d.name for d in src.iterdir() if (d / "__init__.py").is_file()} | {f.name for f in src.glob("*.py")}


def part_of(module: str, src: Path = SRC) -> str:
    pieces = module.split(".")
    if len(pieces) == 1:
        return "__init__.py"
    return pieces[1] if (src / pieces[1]).is_dir() else pieces[1] + ".py"


def parse_table(text: str) -> dict[str, set[str]]:
    """The table under ``HEADING``: each row's part and the names in its second column."""
    if HEADING not in text:
        raise AssertionError(f"docs/architecture.md has no {HEADING!r} section")
    lines = text.split(HEADING, 1)[1].splitlines()
    rows = lines[next(i for i, line in enumerate(lines) if line.startswith("|")) :]
    rows = rows[: next((i for i, line in enumerate(rows) if not line.startswith("|")), len(rows))]
    table: dict[str, set[str]] = {}
    for row in rows[2:]:  # after the header and its separator
        cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
        part = cells[0].strip("`")
        if part in table:
            raise AssertionError(f"the import table has two rows for {part!r}")
        table[part] = set(re.findall(r"`([^`]+)`", cells[1]))
    return table


def full_name(entry: str) -> str:
    name = entry.removesuffix(".*")
    return name if name == "rollserve" else f"rollserve.{name}"


def allows(entries: set[str], target: str) -> bool:
    return any(target == full_name(e) or (e.endswith(".*") and target.startswith(full_name(e) + ".")) for e in entries)


def targets(statement) -> set[str]:
    """What one import statement imports: the modules it names, and the module it
    imports from when it takes any other name from it."""
    return set(statement.modules) | ({statement.base} if statement.other_names or not statement.modules else set())


def violations(table: dict[str, set[str]], found: dict[str, Path], src: Path = SRC) -> list[str]:
    known = set(found)
    wrong = []
    for name, path in sorted(found.items()):
        part = part_of(name, src)
        entries = table.get(part, set())
        face = read_face(path)
        for statement in import_statements(name, path, known) + (face.imports if face else []):
            for target in sorted(targets(statement)):
                if part_of(target, src) == part or allows(entries, target):
                    continue
                where = path.relative_to(ROOT) if ROOT in path.parents else path
                wrong.append(
                    f"{where}:{statement.line}: {name} imports {target}, which the import "
                    f"table's row `{part}` does not allow (it allows: "
                    f"{', '.join(sorted(entries)) or 'nothing of other parts'})"
                )
    return wrong


def table_problems(table: dict[str, set[str]], found: dict[str, Path], src: Path = SRC) -> list[str]:
    problems = [f"{part} has no row in the import table" for part in sorted(parts_of_src(src) - set(table))]
    problems += [
        f"the import table's row `{part}` names no part of src/rollserve"
        for part in sorted(set(table) - parts_of_src(src))
    ]
    for part, entries in sorted(table.items()):
        for entry in sorted(entries):
            if full_name(entry) not in found:
                problems.append(f"the import table's row `{part}` names `{entry}`, which is no module")
            elif part_of(full_name(entry), src) == part:
                problems.append(f"the import table's row `{part}` names its own `{entry}`")
    return problems


# --- the code against the table ---------------------------------------------------------------
def test_every_import_in_src_is_allowed_by_the_table():
    wrong = violations(parse_table(DOC.read_text()), modules())
    assert not wrong, "\n".join(wrong)


def test_the_table_names_real_modules_and_has_a_row_for_every_part():
    problems = table_problems(parse_table(DOC.read_text()), modules())
    assert not problems, "\n".join(problems)


def test_client_and_integrations_need_no_server():
    """They install and run without the server: the table lets them reach only the
    contract, the client, the (pure Python) datasets and the package's ``__init__.py``
    (the version, for the client's User-Agent), which imports nothing."""
    table = parse_table(DOC.read_text())
    assert table["client"] == {"contract.*", "datasets", "rollserve"}
    assert table["integrations"] == {"contract.*", "client"}
    assert table["contract"] == table["datasets"] == table["__init__.py"] == set()


def test_the_routes_depend_on_their_protocol_not_the_composition_root():
    """api reaches the service through ``api.base.ApiService``: its row allows nothing of
    ``server`` (that ``server.Service`` satisfies the protocol is mypy's to prove, where
    the commands hand a ``Service`` to ``create_app`` and ``serve``), and nothing of the
    composition (commands, cluster)."""
    table = parse_table(DOC.read_text())
    assert not {e for e in table["api"] if e.split(".")[0] in {"server", "commands", "cluster"}}


def test_contract_errors_and_faces_are_neutral_on_the_server_side():
    table = parse_table(DOC.read_text())
    neutral = {"contract.*", "errors", "faces"}
    not_server_side = {
        "client",
        "integrations",
        "contract",
        "errors.py",
        "faces.py",
        "datasets",
        "validation.py",
        "cli.py",
        "__main__.py",
        "__init__.py",
    }  # the client side, the neutral, the entry
    missing = {
        part: neutral - entries
        for part, entries in table.items()
        if part not in not_server_side and not neutral <= entries
    }
    assert missing == {}
    assert table["errors.py"] == table["faces.py"] == set()


# --- the lazy faces ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Face:
    """What a lazy face's ``__init__.py`` says, read with ``ast``: ``homes`` its ``_HOMES``;
    ``public`` its ``__all__``; ``typed`` each name imported under ``TYPE_CHECKING`` and the
    module it comes from; ``eager`` the names it imports at run time (outside that block);
    ``imports`` its ``_HOMES`` values as import statements (each at the line it is written)."""

    homes: dict[str, str]
    public: list[str]
    typed: dict[str, str]
    eager: set[str]
    imports: list[ImportStatement]


def is_type_checking(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def imported_names(nodes: list[ast.stmt]) -> dict[str, str]:
    """``from X import a, b as c`` (absolute, top level of ``nodes``): {"a": "X", "c": "X"}."""
    return {
        alias.asname or alias.name: node.module
        for node in nodes
        if isinstance(node, ast.ImportFrom) and node.module and not node.level
        for alias in node.names
    }


def read_face(path: Path) -> Face | None:
    """The face in ``path``, or None when it assigns no ``_HOMES`` at its top level."""
    tree = parse_source(path)
    assigned = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            assigned[node.targets[0].id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
            assigned[node.target.id] = node.value
    if "_HOMES" not in assigned:
        return None
    value = assigned["_HOMES"]
    # a dict display, with ``**dict.fromkeys((names...), home)`` for names sharing a home
    homes = eval(compile(ast.Expression(value), str(path), "eval"), {"__builtins__": {}, "dict": dict})
    lines = {}
    for node in ast.walk(value):
        if isinstance(node, ast.Constant) and node.value in homes.values():
            lines.setdefault(node.value, node.lineno)
    imports = [
        ImportStatement(lines.get(home, value.lineno), home, frozenset(), True) for home in sorted(set(homes.values()))
    ]
    public = ast.literal_eval(assigned["__all__"]) if "__all__" in assigned else []
    typed = imported_names([n for node in tree.body if is_type_checking(node) for n in node.body])
    eager = set(imported_names(tree.body))
    return Face(homes, public, typed, eager, imports)


def face_problems(name: str, face: Face) -> list[str]:
    """``_HOMES`` must name exactly the public names the face does not import eagerly,
    each with the module its ``TYPE_CHECKING`` block imports it from."""
    problems = []
    lazy = set(face.public) - face.eager
    problems += [
        f"{name}: {n!r} is in __all__ and imported neither eagerly nor in _HOMES"
        for n in sorted(lazy - set(face.homes))
    ]
    problems += [
        f"{name}: {n!r} is in _HOMES but not in __all__ (or also imported eagerly)"
        for n in sorted(set(face.homes) - lazy)
    ]
    for n in sorted(set(face.homes) | set(face.typed)):
        if face.homes.get(n) != face.typed.get(n):
            problems.append(
                f"{name}: {n!r} is imported from {face.typed.get(n)} under TYPE_CHECKING "
                f"but _HOMES says {face.homes.get(n)}"
            )
    return problems


def faces(src: Path = SRC) -> dict[str, Face]:
    return {
        name: face
        for name, path in modules(src).items()
        if path.name == "__init__.py" and (face := read_face(path)) is not None
    }


def test_there_are_faces_and_each_one_s_three_lists_agree():
    found = faces()
    assert {"rollserve.agent", "rollserve.handlers", "rollserve.sandbox", "rollserve.testing"} <= set(found)
    problems = [p for name, face in found.items() for p in face_problems(name, face)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("face", sorted(faces()))
def test_every_public_face_name_resolves(face):
    """A face re-exports names lazily; each one it lists must still be where it says
    (the very object of its home module), listed by ``dir``, asked for in a fresh
    interpreter (no other face has run first and filled a cache); a name it does not
    list is an AttributeError."""
    code = (
        "import importlib\n"
        f"face = importlib.import_module({face!r})\n"
        "assert set(face.__all__) <= set(dir(face)), set(face.__all__) - set(dir(face))\n"
        "for name in face.__all__:\n"
        "    value = getattr(face, name)\n"
        "    if name in face._HOMES:\n"
        "        assert value is getattr(importlib.import_module(face._HOMES[name]), name), name\n"
        "try:\n"
        "    face.no_such_name\n"
        "except AttributeError as e:\n"
        "    assert 'has no attribute' in str(e) and face.__name__ in str(e), e\n"
        "else:\n"
        "    raise AssertionError('a name the face does not list resolved')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC.parent), *sys.path])},
    )
    assert done.returncode == 0, done.stderr


# --- the checks themselves can fail ------------------------------------------------------------
def fake_src(tmp_path: Path, files: dict[str, str]) -> Path:
    src = tmp_path / "rollserve"
    for rel, text in {
        "__init__.py": "",
        "low/__init__.py": "",
        "low/base.py": "",
        "low/inner.py": "",
        "high/__init__.py": "",
        **files,
    }.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    return src


@pytest.mark.parametrize(
    "source",
    [
        "from rollserve.low.inner import x",
        "from rollserve.low import inner",
        "from ..low import inner",
        "from ..low.inner import x",
        "import rollserve.low.inner",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rollserve.low.inner import x",
        "def f():\n    from rollserve.low.inner import x",
    ],
)
def test_a_forbidden_import_is_named_wherever_it_is(tmp_path, source):
    src = fake_src(tmp_path, {"high/mod.py": source})
    table = {"__init__.py": set(), "low": set(), "high": {"low.base"}}
    wrong = violations(table, modules(src), src)
    assert len(wrong) == 1
    assert "rollserve/high/mod.py:" in wrong[0] and "imports rollserve.low.inner" in wrong[0]
    assert "row `high`" in wrong[0] and "low.base" in wrong[0]


def test_allowed_imports_pass(tmp_path):
    src = fake_src(
        tmp_path,
        {
            "high/mod.py": "from rollserve.low.base import x\nfrom rollserve.low import y\n"
            "from rollserve.low.inner import z\nfrom . import other\n",
            "high/other.py": "",
        },
    )
    table = {"__init__.py": set(), "low": set(), "high": {"low.base", "low"}}
    assert violations(table, modules(src), src) == [
        f"{src / 'high/mod.py'}:3: rollserve.high.mod imports rollserve.low.inner, which the import "
        "table's row `high` does not allow (it allows: low, low.base)"
    ]
    assert violations({**table, "high": {"low.*"}}, modules(src), src) == []


def test_a_table_that_rots_fails(tmp_path):
    src = fake_src(tmp_path, {"high/mod.py": ""})
    found = modules(src)
    assert table_problems({"__init__.py": set(), "low": set(), "high": {"low.base"}}, found, src) == []
    assert table_problems({"__init__.py": set(), "high": {"low.gone", "high.mod"}, "old": set()}, found, src) == [
        "low has no row in the import table",
        "the import table's row `old` names no part of src/rollserve",
        "the import table's row `high` names its own `high.mod`",
        "the import table's row `high` names `low.gone`, which is no module",
    ]


def test_the_table_is_read_from_its_section():
    text = (
        "# doc\n| a | b |\n| --- | --- |\n| `x` | `y` |\n\n" + HEADING + "\n\nwords\n\n"
        "| part | may import | why |\n| --- | --- | --- |\n| `api` | `engine.base`, `contract.*` | `not.this` |\n"
        "| `contract` | | none |\n\nafter\n| `z` | `w` |\n"
    )
    assert parse_table(text) == {"api": {"engine.base", "contract.*"}, "contract": set()}
    with pytest.raises(AssertionError, match="two rows"):
        parse_table(text.replace("| `contract` |", "| `api` |"))


FACE = (
    "from typing import TYPE_CHECKING\n"
    "from rollserve.low.base import e\n"
    "if TYPE_CHECKING:\n"
    "    from rollserve.low.base import a\n"
    "    from rollserve.high.other import b\n"
    "_HOMES: dict[str, str] = {\n"
    '    "a": "rollserve.low.base",\n'
    '    **dict.fromkeys(("b",), "rollserve.high.other"),\n'
    "}\n"
    '__all__ = ["a", "b", "e"]\n'
)


def test_a_face_s_homes_count_as_its_imports(tmp_path):
    face = FACE.replace('"a": "rollserve.low.base"', '"a": "rollserve.low.inner"')
    src = fake_src(tmp_path, {"high/__init__.py": face, "high/other.py": ""})
    table = {"__init__.py": set(), "low": set(), "high": {"low.base"}}
    wrong = violations(table, modules(src), src)
    assert len(wrong) == 1, wrong
    assert "rollserve/high/__init__.py:7: rollserve.high imports rollserve.low.inner" in wrong[0]


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (("", ""), None),
        (('__all__ = ["a", "b", "e"]', '__all__ = ["a", "b"]'), None),  # an eager name need not be public
        (
            ('__all__ = ["a", "b", "e"]', '__all__ = ["a", "e"]'),
            "'b' is in _HOMES but not in __all__ (or also imported eagerly)",
        ),
        (
            ('__all__ = ["a", "b", "e"]', '__all__ = ["a", "b", "c", "e"]'),
            "'c' is in __all__ and imported neither eagerly nor in _HOMES",
        ),
        (
            ('"a": "rollserve.low.base"', '"a": "rollserve.low"'),
            "'a' is imported from rollserve.low.base under TYPE_CHECKING but _HOMES says rollserve.low",
        ),
        (
            ("    from rollserve.high.other import b\n", ""),
            "'b' is imported from None under TYPE_CHECKING but _HOMES says rollserve.high.other",
        ),
    ],
)
def test_a_face_whose_lists_drift_apart_is_named(tmp_path, change, problem):
    src = fake_src(tmp_path, {"high/__init__.py": FACE.replace(*change), "high/other.py": ""})
    found = faces(src)
    assert set(found) == {"rollserve.high"}
    problems = face_problems("rollserve.high", found["rollserve.high"])
    assert problems == ([] if problem is None else [f"rollserve.high: {problem}"]), problems
