"""HTTP status codes live where HTTP is served: ``api/`` and the gateway's own servers
(``agent.gateway.unix_socket`` and the wire modules it shares with the routes). Below
them (engine, handlers, llm, sandbox, the agent and the gateway's session logic) a
refusal is a typed error, mapped to a status in one table per server.

Read from the source (ast), two rules:

- no exception is made with an HTTP error status (an int literal 400-599 as an
  argument, or any call's ``status=``/``status_code=`` keyword set to one);
- outside ``llm`` (whose backend clients read a server's answer: ``exc.status in
  (404, 405)`` is theirs to decide), no value is compared with an HTTP error status.

Numbers that merely fall in 400-599 (``Field(512, ...)``, ``st_blocks * 512``,
``[-500:]``) are neither, and are not flagged.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from tests.source_ast import parse_source

SRC = Path(__file__).resolve().parents[1] / "src" / "rollserve"
LAYERS = ("engine", "handlers", "llm", "sandbox", "agent")
# What serves HTTP itself: the sandbox's socket server and the wire it shares with api/.
SERVES_HTTP = {"agent/gateway/unix_socket.py", "agent/gateway/wire.py", "agent/gateway/anthropic_wire.py"}
READS_RESPONSES = ("llm",)  # backend clients: they read the status a server answered
STATUS_KEYWORDS = {"status", "status_code"}


def _is_status(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int and 400 <= node.value <= 599


def _statuses(node: ast.AST) -> bool:
    """``node`` is an HTTP error status, or a tuple/list/set holding one."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_is_status(e) for e in node.elts)
    return _is_status(node)


def _dotted(node: ast.AST) -> list[str] | None:
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else [*base, node.attr]
    return None


def _is_exception(func: ast.AST, namespace: dict[str, object]) -> bool:
    """Whether the callee is an exception class: looked up in the module's namespace,
    else (a name bound locally) judged by its name."""
    path = _dotted(func)
    if path is None:
        return False
    found: object = namespace.get(path[0])
    for attr in path[1:]:
        found = getattr(found, attr, None)
    if isinstance(found, type):
        return issubclass(found, BaseException)
    return path[-1].endswith(("Error", "Exception", "Refusal"))


def namespace_of(tree: ast.Module) -> dict[str, object]:
    """What the module's names are, without importing it (some modules run code at
    import: the pytest plugins written for the sandbox): what it imports, absolutely,
    looked up; a class it defines is an exception when a base of it is one."""
    names: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            module = importlib.import_module(node.module)
            for alias in node.names:
                names[alias.asname or alias.name] = getattr(module, alias.name, None)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                importlib.import_module(alias.name)
                bound = alias.name if alias.asname else alias.name.split(".")[0]
                names[alias.asname or bound] = importlib.import_module(bound)
        elif isinstance(node, ast.ClassDef):
            if any(_is_exception(base, names) for base in node.bases):
                names[node.name] = type(node.name, (Exception,), {})
    return names


def violations(tree: ast.Module, namespace: dict[str, object], compare: bool) -> list[str]:
    """Each place in ``tree`` that breaks a rule, as ``line: what``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for keyword in node.keywords:
                if keyword.arg in STATUS_KEYWORDS and _statuses(keyword.value):
                    found.append(f"{node.lineno}: {keyword.arg}={ast.unparse(keyword.value)}")
            if _is_exception(node.func, namespace) and any(
                _statuses(a) for a in [*node.args, *(k.value for k in node.keywords)]
            ):
                found.append(f"{node.lineno}: {ast.unparse(node)[:80]}")
        elif compare and isinstance(node, ast.Compare):
            if any(_statuses(side) for side in [node.left, *node.comparators]):
                found.append(f"{node.lineno}: compares with {ast.unparse(node)[:80]}")
    return found


def _modules() -> list[Path]:
    paths = [p for layer in LAYERS for p in sorted((SRC / layer).rglob("*.py"))]
    return [p for p in paths if p.relative_to(SRC).as_posix() not in SERVES_HTTP]


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.relative_to(SRC).as_posix())
def test_no_http_status_below_the_servers(path: Path):
    relative = path.relative_to(SRC)
    tree = parse_source(path)  # (the one parse of our source, with its 3.11 retry)
    compare = relative.parts[0] not in READS_RESPONSES
    found = violations(tree, namespace_of(tree), compare)
    assert not found, (
        f"{relative}: an HTTP status below the servers; raise a typed error and map it where HTTP is served: {found}"
    )


class _Refusal(Exception):
    pass


@pytest.mark.parametrize(
    "source",
    [
        "raise _Refusal(401, 'unknown key')",
        "def f():\n    return _Refusal(408, 'late')",
        "raise Anything(message='x', status=429)",
        "raise LocalRefusal(502, 'backend')",  # not in the namespace: judged by its name
        "if error.status == 404:\n    pass",
        "if error.status in (404, 405):\n    pass",
        "ok = 400 <= code",
    ],
)
def test_the_scan_finds_a_status(source: str):
    assert violations(ast.parse(source), {"_Refusal": _Refusal}, compare=True)


@pytest.mark.parametrize(
    "source",
    [
        "size = Field(512, ge=32)",
        "total = st.st_blocks * 512",
        "tail = text[-500:]",
        "raise _Refusal(f'limit of {500} bytes')",
        "MAX = 400",
        "if n > 4096:\n    pass",
        "raise _Refusal('too long', param='messages')",
    ],
)
def test_the_scan_leaves_other_numbers_alone(source: str):
    assert not violations(ast.parse(source), {"_Refusal": _Refusal}, compare=True)


def test_the_namespace_knows_exceptions_by_their_bases():
    source = "from rollserve.errors import InfraError\nclass Refused(InfraError):\n    pass\nclass Plain:\n    pass\n"
    names = namespace_of(ast.parse(source))
    assert violations(ast.parse("raise Refused(404, 'x')"), names, compare=False)
    assert not violations(ast.parse("x = Plain(404)"), names, compare=False)


def test_backend_clients_may_read_a_status():
    source = "if exc.status in (404, 405):\n    pass"
    assert not violations(ast.parse(source), {}, compare=False)
    assert violations(ast.parse("raise _Refusal(404, 'x')"), {"_Refusal": _Refusal}, compare=False)
