"""The names an assert uses, and where they come from: the setup code, the builtins,
or the solution (``code.asserts``).

A probe that uses only the setup's names and the builtins is a *reference* candidate:
its value may be computed without the solution (``code.hidden_tests``).
"""

from __future__ import annotations

import ast
import builtins
from dataclasses import dataclass, replace

STAR = "*"  # in the setup's names: a star import, which may bind any name
BUILTINS = frozenset(name for name in dir(builtins) if not name.startswith("_"))


@dataclass(frozen=True)
class ProbeInfo:
    """What evaluating one probe in the solution's process would decide there."""

    judges: str | None  # why it judges the solution's objects there, or None
    setup_truth: bool  # its truth is (part of) the verdict and it uses setup names
    names: frozenset[str]  # the free names it uses
    reference: bool = False  # may be computed without the solution (see above)
    handed: bool = False  # uses a setup value the solution is handed in the same check


def imports_all_of(node: ast.AST, module: str | None) -> bool:
    """Whether ``node`` is ``from <module> import *``: what the runner does already."""
    return (
        isinstance(node, ast.ImportFrom)
        and module is not None
        and node.module == module
        and node.level == 0
        and [alias.name for alias in node.names] == ["*"]
    )


def setup_names(setup: str, module: str | None = None) -> frozenset[str]:
    """The names the setup code may bind (``import math`` aside: that one is math; and
    ``from <module> import *`` of the solution's module, which binds the solution's)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(setup)):
        if not imports_all_of(node, module):
            names.update(_bound_by(node))
    return frozenset(names)


def _bound_by(node: ast.AST) -> list[str]:
    """The names one node binds (``STAR`` for a ``*`` import; ``import math`` binds none)."""
    if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
        return [node.id]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return _imported(node)
    if isinstance(node, (ast.Global, ast.Nonlocal)):
        return list(node.names)
    if isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
        return [node.name]
    return []


def _imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    names = []
    for alias in node.names:
        if alias.name == "*":
            names.append(STAR)
        elif not (isinstance(node, ast.Import) and alias.name == "math" and alias.asname is None):
            names.append(alias.asname or alias.name.split(".")[0])
    return names


def references(info: list[ProbeInfo], bound: frozenset[str], solution: frozenset[str] = frozenset()) -> list[ProbeInfo]:
    """``info`` with ``reference`` set where a probe needs only the setup's names and
    the builtins, and ``handed`` where it uses a setup name a solution probe uses too.
    ``solution``: names known to be the solution's (the entry point), even where a
    builtin has the name (``pow``)."""
    if STAR in bound:
        return info
    known = bound | ((BUILTINS | {"math"}) - solution)
    solution_probes = [i for i in info if not i.names <= known]
    handed = frozenset[str]().union(*(i.names for i in solution_probes)) & bound
    return [replace(i, reference=i.names <= known, handed=bool(i.names & handed)) for i in info]


def free_names(node: ast.AST) -> frozenset[str]:
    """The names ``node`` reads that it does not bind itself (comprehension variables,
    lambda arguments)."""
    loads: set[str] = set()
    stores: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            (loads if isinstance(sub.ctx, ast.Load) else stores).add(sub.id)
        elif isinstance(sub, ast.arg):
            stores.add(sub.arg)
    return frozenset(loads - stores)
