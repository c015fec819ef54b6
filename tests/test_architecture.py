"""docs/architecture.md's import table is the one list of what each part of
``src/rollserve`` may import of the others, and this holds the code to it.

Every import statement in ``src/`` is read with ``ast`` (anywhere in a file: under
``TYPE_CHECKING`` and inside functions too; relative imports resolved; ``from pkg import
module`` counted as the module), and one the table does not allow fails naming its
``file:line`` and the row. The table itself must name only modules that exist and give
every part of ``src/`` a row, so the document cannot rot. (llm's insides have their own
arrows and cycle check: ``tests/llm/test_layering.py``; both read imports through
``tests.source_ast.import_statements``.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import rollserve
from tests.source_ast import import_statements

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
    return ({d.name for d in src.iterdir() if (d / "__init__.py").is_file()}
            | {f.name for f in src.glob("*.py")})


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
    rows = lines[next(i for i, line in enumerate(lines) if line.startswith("|")):]
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
    return any(target == full_name(e) or (e.endswith(".*") and target.startswith(full_name(e) + "."))
               for e in entries)


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
        for statement in import_statements(name, path, known):
            for target in sorted(targets(statement)):
                if part_of(target, src) == part or allows(entries, target):
                    continue
                where = path.relative_to(ROOT) if ROOT in path.parents else path
                wrong.append(f"{where}:{statement.line}: {name} imports {target}, which the import "
                             f"table's row `{part}` does not allow (it allows: "
                             f"{', '.join(sorted(entries)) or 'nothing of other parts'})")
    return wrong


def table_problems(table: dict[str, set[str]], found: dict[str, Path], src: Path = SRC) -> list[str]:
    problems = [f"{part} has no row in the import table" for part in sorted(parts_of_src(src) - set(table))]
    problems += [f"the import table's row `{part}` names no part of src/rollserve"
                 for part in sorted(set(table) - parts_of_src(src))]
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
    contract, the client and the (pure Python) datasets."""
    table = parse_table(DOC.read_text())
    assert table["client"] == {"contract.*", "datasets"}
    assert table["integrations"] == {"contract.*", "client"}
    assert table["contract"] == table["datasets"] == set()


def test_contract_errors_and_faces_are_neutral_on_the_server_side():
    table = parse_table(DOC.read_text())
    neutral = {"contract.*", "errors", "faces"}
    not_server_side = {"client", "integrations", "contract", "errors.py", "faces.py", "datasets", "validation.py",
                       "cli.py", "__main__.py", "__init__.py"}  # the client side, the neutral, the entry
    missing = {part: neutral - entries for part, entries in table.items()
               if part not in not_server_side and not neutral <= entries}
    assert missing == {}
    assert table["errors.py"] == table["faces.py"] == set()


def faces() -> list[str]:
    return [name for name, path in modules().items()
            if path.name == "__init__.py" and "_HOMES" in path.read_text()]


@pytest.mark.parametrize("face", faces())
def test_every_public_face_name_resolves(face):
    """A face re-exports names lazily; each one it lists must still be where it says,
    asked for in a fresh interpreter (no other face has run first and filled a cache)."""
    code = ("import importlib\n"
            f"face = importlib.import_module({face!r})\n"
            "for name in face.__all__:\n"
            "    getattr(face, name)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC.parent), *sys.path])})
    assert done.returncode == 0, done.stderr


# --- the checks themselves can fail ------------------------------------------------------------
def fake_src(tmp_path: Path, files: dict[str, str]) -> Path:
    src = tmp_path / "rollserve"
    for rel, text in {"__init__.py": "", "low/__init__.py": "", "low/base.py": "",
                      "low/inner.py": "", "high/__init__.py": "", **files}.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    return src


@pytest.mark.parametrize("source", [
    "from rollserve.low.inner import x",
    "from rollserve.low import inner",
    "from ..low import inner",
    "from ..low.inner import x",
    "import rollserve.low.inner",
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rollserve.low.inner import x",
    "def f():\n    from rollserve.low.inner import x",
])
def test_a_forbidden_import_is_named_wherever_it_is(tmp_path, source):
    src = fake_src(tmp_path, {"high/mod.py": source})
    table = {"__init__.py": set(), "low": set(), "high": {"low.base"}}
    wrong = violations(table, modules(src), src)
    assert len(wrong) == 1
    assert "rollserve/high/mod.py:" in wrong[0] and "imports rollserve.low.inner" in wrong[0]
    assert "row `high`" in wrong[0] and "low.base" in wrong[0]


def test_allowed_imports_pass(tmp_path):
    src = fake_src(tmp_path, {"high/mod.py": "from rollserve.low.base import x\nfrom rollserve.low import y\n"
                                             "from rollserve.low.inner import z\nfrom . import other\n",
                              "high/other.py": ""})
    table = {"__init__.py": set(), "low": set(), "high": {"low.base", "low"}}
    assert violations(table, modules(src), src) == [
        f"{src / 'high/mod.py'}:3: rollserve.high.mod imports rollserve.low.inner, which the import "
        "table's row `high` does not allow (it allows: low, low.base)"]
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
    text = ("# doc\n| a | b |\n| --- | --- |\n| `x` | `y` |\n\n" + HEADING + "\n\nwords\n\n"
            "| part | may import | why |\n| --- | --- | --- |\n| `api` | `engine.base`, `contract.*` | `not.this` |\n"
            "| `contract` | | none |\n\nafter\n| `z` | `w` |\n")
    assert parse_table(text) == {"api": {"engine.base", "contract.*"}, "contract": set()}
    with pytest.raises(AssertionError, match="two rows"):
        parse_table(text.replace("| `contract` |", "| `api` |"))
