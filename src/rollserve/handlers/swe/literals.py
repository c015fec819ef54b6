"""Strings for the machinery scan (``machinery``): a string an expression builds from
literals alone (``"_get" + "frame"``, ``"".join(["s", "ys"])``, ``f"{'PYTEST'}_X"``,
``chr(115)``, ``"sys"[::-1]``, ``bytes.fromhex("...").decode()``), and the strings
that tell of test machinery or of hunting for it."""

from __future__ import annotations

import ast
import re

MAX_LENGTH = 4096  # a longer built string is not folded
_METHODS = frozenset(
    {
        "lower",
        "upper",
        "strip",
        "lstrip",
        "rstrip",
        "replace",
        "decode",
        "encode",
        "title",
        "capitalize",
        "casefold",
        "swapcase",
        "removeprefix",
        "removesuffix",
    }
)
# Strings that name pytest, its environment, the grader's files, /proc, or attributes
# looked up by name to reach frames, imports and hooks.
TELLING = re.compile(
    r"(_?pytest|pluggy)(\.[\w.]*)?|_?PYTEST_[A-Z_]*|/proc/.*|(?i:.*rollserve.*)|.*/\.git/.*"
    r"|__builtins__|__import__|__subclasses__|_getframe|f_back|f_locals|f_globals|tb_frame"
    r"|meta_path|path_hooks|settrace|setprofile|excepthook|from_item_and_call|TestReport"
    r"|CallInfo",
    re.DOTALL,
)
_NAMES = re.compile(
    r"__\w+__|_getframe|f_back|f_locals|f_globals|tb_frame|meta_path"
    r"|path_hooks|settrace|setprofile|excepthook|from_item_and_call|TestReport"
    r"|CallInfo"
)


def literal(node: ast.AST | None) -> str | None:
    """A string or bytes constant's text."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
        value = node.value
        return value.decode("latin-1") if isinstance(value, bytes) else value
    return None


def fold(node: ast.AST | None, depth: int = 0) -> str | None:
    """The string ``node`` builds from literals alone, or None."""
    if node is None or depth > 50:
        return None
    value = _fold(node, depth + 1)
    return value if value is None or len(value) <= MAX_LENGTH else None


def _fold(node: ast.AST, depth: int) -> str | None:
    if isinstance(node, ast.Constant):
        return literal(node)
    if isinstance(node, ast.BinOp):
        left, right = fold(node.left, depth), fold(node.right, depth)
        if isinstance(node.op, ast.Add) and left is not None and right is not None:
            return left + right
        if isinstance(node.op, ast.Mult) and left is not None and _int(node.right) is not None:
            return left * min(_int(node.right) or 0, MAX_LENGTH)
        return None
    if isinstance(node, ast.JoinedStr):
        parts = [fold(v.value if isinstance(v, ast.FormattedValue) else v, depth) for v in node.values]
        return "".join(p for p in parts if p is not None) if None not in parts else None
    if isinstance(node, ast.Subscript):
        return _subscript(node, depth)
    if isinstance(node, ast.Call) and not node.keywords:
        return _call(node, depth)
    return None


def _int(node: ast.AST | None) -> int | None:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _int(node.operand)
        return -inner if inner is not None else None
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    return None


def _subscript(node: ast.Subscript, depth: int) -> str | None:
    value = fold(node.value, depth)
    if value is None:
        return None
    index = node.slice
    if isinstance(index, ast.Slice):
        bounds = [_int(b) if b is not None else None for b in (index.lower, index.upper, index.step)]
        if (
            any(b is None and given is not None for b, given in zip(bounds, (index.lower, index.upper, index.step)))
            or bounds[2] == 0
        ):
            return None
        return value[bounds[0] : bounds[1] : bounds[2]]
    position = _int(index)
    if position is not None and -len(value) <= position < len(value):
        return value[position]
    return None


def _call(node: ast.Call, depth: int) -> str | None:
    func = node.func
    if isinstance(func, ast.Name) and len(node.args) == 1:
        if func.id == "chr" and (code := _int(node.args[0])) is not None and 0 <= code < 0x110000:
            return chr(code)
        if func.id == "str":
            return fold(node.args[0], depth)
        return None
    if not isinstance(func, ast.Attribute):
        return None
    if func.attr == "fromhex" and isinstance(func.value, ast.Name) and len(node.args) == 1:
        text = fold(node.args[0], depth)
        try:
            return bytes.fromhex(text).decode("latin-1") if text is not None else None
        except ValueError:
            return None
    base = fold(func.value, depth)
    if base is None:
        return None
    return _method_call(base, func.attr, node.args, depth)


def _method_call(base: str, method: str, args: list[ast.expr], depth: int) -> str | None:
    """``<base>.<method>(<args>)`` of a string the fold knows: ``join`` of a literal list,
    or one of ``_METHODS`` (``encode``/``decode`` keep the text as it is)."""
    if method == "join" and len(args) == 1 and isinstance(args[0], (ast.List, ast.Tuple)):
        parts = [fold(e, depth) for e in args[0].elts]
        return base.join(p for p in parts if p is not None) if None not in parts else None
    if method not in _METHODS:
        return None
    values = [fold(a, depth) for a in args]
    if None in values or method in ("decode", "encode"):
        return base if None not in values else None
    try:
        result = getattr(base, method)(*values)
    except (TypeError, ValueError):
        return None
    return result if isinstance(result, str) else None


def telling(value: str) -> bool:
    """Whether a string names test machinery, the grader's files or an attribute
    reached by name to get at frames, imports or hooks."""
    return bool(TELLING.fullmatch(value))


def is_built_name(node: ast.AST) -> bool:
    """Whether ``node`` builds from literals a string that is not itself a literal."""
    return not isinstance(node, ast.Constant) and fold(node) is not None


def attribute_name(value: str) -> bool:
    """Whether a telling string is an attribute's name (obfuscation) rather than a
    module's or a path (test machinery)."""
    return bool(_NAMES.fullmatch(value))


class Strings(ast.NodeVisitor):
    """Strings, literal or built from literals, that name test machinery, the grader's
    files or attributes to look up by name (``telling``)."""

    def __init__(self, own: frozenset[str]) -> None:
        self.own = own
        self.found: list[tuple[str, int]] = []

    def visit(self, node: ast.AST) -> None:
        if isinstance(node, (ast.Constant, ast.BinOp, ast.JoinedStr, ast.Call, ast.Subscript)):
            value = fold(node)
            if value is not None:
                self._check(value, node)
                return  # (its pieces are not strings of their own)
        super().visit(node)

    def _check(self, value: str, node: ast.AST) -> None:
        if not telling(value) or value.lstrip(".").split(".", 1)[0] in self.own:
            return
        category = "obfuscation" if attribute_name(value) else "test machinery"
        self.found.append((f"{category}: the string {value[:60]!r}", getattr(node, "lineno", 0)))
