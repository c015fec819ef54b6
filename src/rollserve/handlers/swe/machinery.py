"""The scan of a candidate patch's code for reaching into test machinery.

The tests run in the interpreter of the code under test, so code a patch adds can
decide what they see: rewrite pytest's reports, return a value equal to anything
when a test's frame calls it, end the run before a failure is written. A fix needs
none of it. ``added`` counts, with the ``ast`` module, the constructs below in a
file before and after the patch; a finding is one more frequent after, so what the
repository already does (SymPy's ``sys._getframe``) is never one (``_RULES``,
``ATTRIBUTES``, ``_SURGERY``, ``literals.TELLING``; docs/families.md and docs/security.md, "The machinery scan"):
test machinery (``pytest``, ``_pytest``, ``pluggy``, ``unittest``, ``doctest``, hook
functions, telling strings); ``sys.modules`` changed and import hooks; frame, gc and
object-graph introspection; exit and trace hooks; and obfuscation that would hide
those (computed or piece-built names, ``exec`` of anything but a literal, whose code
is scanned, ``__builtins__``, star imports, code objects built, ``ctypes``).

Names are resolved through imports, aliases (``m = sys``), re-exports (``os.sys``),
``getattr(m, "x")``, ``__import__("x")``, ``sys.modules["x"]`` and strings folded from
literal pieces (``literals.fold``). References into the repository's own top-level
packages are exempt; in a repository that is itself test machinery only obfuscation
counts. A file that does not parse is a finding. What a string computed at run time
reaches on an object that is not a watched module, the other layers must catch.
"""

from __future__ import annotations

import ast
from collections import Counter
from dataclasses import dataclass

from rollserve.handlers.swe import python_ast
from rollserve.handlers.swe.literals import Strings, fold, is_built_name

MACHINERY = frozenset({"pytest", "_pytest", "pluggy", "unittest", "doctest", "nose", "nose2"})
_RULES: dict[str, tuple[str, ...]] = {
    "the module table": ("importlib.reload",),  # (and sys.modules changed: _SURGERY)
    "an import hook": (
        "sys.meta_path",
        "sys.path_hooks",
        "sys.path_importer_cache",
        "importlib.machinery.SourceFileLoader",
        "importlib.machinery.FileFinder",
        "importlib.machinery.SourcelessFileLoader",
        "importlib.machinery.PathFinder",
        "importlib.machinery.ExtensionFileLoader",
        "importlib.abc",
        "importlib.util.spec_from_loader",
        "importlib.util.spec_from_file_location",
        "importlib.util.module_from_spec",
        "runpy",
        "__import__",
    ),
    "frame or gc introspection": (
        "sys._getframe",
        "sys._current_frames",
        "inspect.currentframe",
        "inspect.stack",
        "inspect.trace",
        "inspect.getouterframes",
        "inspect.getinnerframes",
        "inspect.getframeinfo",
        "traceback.extract_stack",
        "traceback.format_stack",
        "traceback.print_stack",
        "traceback.walk_stack",
        "gc.get_objects",
        "gc.get_referrers",
        "gc.get_referents",
    ),
    "an exit or trace hook": (
        "atexit",
        "os._exit",
        "os.abort",
        "sys.excepthook",
        "sys.unraisablehook",
        "sys.settrace",
        "sys.setprofile",
        "sys.addaudithook",
        "sys.monitoring",
        "threading.settrace",
        "threading.setprofile",
        "threading.settrace_all_threads",
        "threading.setprofile_all_threads",
        "threading.excepthook",
        "signal.signal",
        "signal.setitimer",
        "signal.alarm",
        "signal.set_wakeup_fd",
    ),
    "obfuscation": ("__builtins__", "marshal.loads", "ctypes"),  # (and _BUILDERS called)
}
_PREFIXES = {prefix: category for category, prefixes in _RULES.items() for prefix in prefixes}
ATTRIBUTES = frozenset(
    {"f_back", "f_locals", "f_globals", "f_builtins", "tb_frame", "gi_frame", "cr_frame", "ag_frame", "__subclasses__"}
)
# sys.modules is read by every importer (Sphinx's autodoc, Django's autoreloader):
# changing it is the finding (what is read by a telling name is one too).
_SURGERY = frozenset({"pop", "popitem", "update", "setdefault", "clear", "__setitem__", "__delitem__"})
_REPLACED = ("sys.exit", "os._exit", "exit", "quit")  # replaced (stored), not called
_EXECUTORS = frozenset({"exec", "eval", "compile"})
_BUILDERS = frozenset({"types.CodeType", "types.FunctionType"})  # called: code made at run time
_IMPORTERS = frozenset({"__import__", "importlib.import_module", "importlib.__import__"})
_ATTR_CALLS = frozenset({"getattr", "setattr", "delattr", "hasattr"})
_WATCHED = frozenset(
    {
        "sys",
        "gc",
        "inspect",
        "atexit",
        "signal",
        "threading",
        "builtins",
        "importlib",
        "traceback",
        "ctypes",
        "marshal",
        *MACHINERY,
    }
)


@dataclass(frozen=True)
class Finding:
    """One construct the patch added: where (the file after the patch) and what."""

    file: str
    line: int
    what: str

    def as_dict(self) -> dict[str, object]:
        return {"file": self.file, "line": self.line, "what": self.what}


def _root(name: str) -> str:
    return name.lstrip(".").split(".", 1)[0]


class _Scanner(ast.NodeVisitor):
    """The constructs of one module: (key, line) pairs; key = "category: detail"."""

    def __init__(self, own: frozenset[str]) -> None:
        self.own = own
        self.aliases: dict[str, str] = {}  # local name -> what it is (module or attribute)
        self.found: list[tuple[str, int]] = []

    # --- recording ------------------------------------------------------------------
    def _add(self, category: str, detail: str, node: ast.AST) -> None:
        self.found.append((f"{category}: {detail}", getattr(node, "lineno", 0)))

    def _name(self, name: str, node: ast.AST, imported: bool = True, store: bool = False) -> None:
        """Check a resolved dotted name (``imported``: its root is a module)."""
        name, parts = self._unaliased(name, node, imported, store)
        for part in parts[1:]:
            if part in ATTRIBUTES:
                self._add("frame or gc introspection", f".{part}", node)
        if not imported and name not in ("__import__", "__builtins__"):
            return
        root = _root(name)
        if root in MACHINERY and root not in self.own and not name.startswith("."):
            self._add("test machinery", name, node)
            return
        if store and name in _REPLACED:
            self._add("an exit or trace hook", f"{name} replaced", node)
        if store and name == "sys.modules":
            self._add("the module table", "sys.modules changed", node)
        self._prefixed(parts, node)

    def _unaliased(self, name: str, node: ast.AST, imported: bool, store: bool) -> tuple[str, list[str]]:
        """The name as what it reaches, and its parts: ``builtins.x`` as ``x`` (an
        assignment to it noted), a module reached through another (``os.sys.modules``)
        as itself (``sys.modules``)."""
        if name.startswith("builtins."):
            if store:
                self._add("obfuscation", f"assignment to {name}", node)
            name = name[len("builtins.") :]
        parts = name.split(".")
        for i, part in enumerate(parts[1:], 1):  # os.sys.modules is sys.modules
            if imported and part in _WATCHED and part != parts[i - 1] and not name.startswith("."):
                return ".".join(parts[i:]), parts[i:]
        return name, parts

    def _prefixed(self, parts: list[str], node: ast.AST) -> None:
        """The longest watched prefix of the dotted name (``_PREFIXES``), if any."""
        for end in range(len(parts), 0, -1):
            prefix = ".".join(parts[:end])
            if prefix in _PREFIXES:
                self._add(_PREFIXES[prefix], prefix, node)
                return

    # --- resolution -----------------------------------------------------------------
    def resolve(self, node: ast.AST) -> tuple[str, bool] | None:
        """The dotted name an expression stands for, and whether its root is imported."""
        if isinstance(node, ast.Name):
            if node.id in self.aliases:
                return self.aliases[node.id], True
            return node.id, node.id == "__builtins__"
        if isinstance(node, ast.Attribute):
            base = self.resolve(node.value)
            return (f"{base[0]}.{node.attr}", base[1]) if base else None
        if isinstance(node, ast.Call) and node.args:
            func = self.resolve(node.func)
            first = node.args[0]
            if func and func[0] in _IMPORTERS and fold(first) is not None:
                return str(fold(first)), True
            if func and func[0] == "getattr" and len(node.args) >= 2 and fold(node.args[1]) is not None:
                base = self.resolve(first)
                return (f"{base[0]}.{fold(node.args[1])}", base[1]) if base else None
        if isinstance(node, ast.Subscript):
            base = self.resolve(node.value)
            key = fold(node.slice)
            if base and base[0] == "sys.modules" and key is not None:
                return str(key), True
        return None

    def _watched(self, node: ast.AST) -> str | None:
        """The name ``node`` stands for if it is a watched module or in one (``sys``,
        ``os.sys.modules``, ``builtins``, ``_pytest.reports``), else None."""
        resolved = self.resolve(node)
        if resolved is None or not resolved[1] or resolved[0].startswith(".") or _root(resolved[0]) in self.own:
            return None
        parts = resolved[0].split(".")
        for i, part in enumerate(parts):
            if part in _WATCHED:
                return ".".join(parts[i:])
        return None

    # --- the visits -----------------------------------------------------------------
    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            local = alias.asname or alias.name.split(".", 1)[0]
            self.aliases[local] = alias.name if alias.asname else local
            self._name(alias.name, node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = "." * node.level + (node.module or "")
        for alias in node.names:
            if alias.name == "*":
                if node.level == 0 and _root(module) in _WATCHED:
                    self._add("obfuscation", f"from {module} import *", node)
                continue
            name = f"{module}.{alias.name}" if module and not module.endswith(".") else module + alias.name
            self.aliases[alias.asname or alias.name] = name
            if node.level == 0:
                self._name(name, node)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        if node.name.startswith("pytest_") and not self.own & {"pytest", "_pytest"}:
            self._add("test machinery", f"def {node.name} (a pytest hook)", node)
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Assign(self, node: ast.Assign) -> None:
        self.generic_visit(node)
        resolved = self.resolve(node.value)
        for target in node.targets:
            if isinstance(target, ast.Name) and resolved and resolved[1]:
                self.aliases[target.id] = resolved[0]

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in self.aliases or node.id in ("__import__", "__builtins__"):
            resolved = self.resolve(node)
            if resolved:
                self._name(resolved[0], node, resolved[1], isinstance(node.ctx, ast.Store))

    def visit_Attribute(self, node: ast.Attribute) -> None:
        resolved = self.resolve(node)
        if resolved is None:
            if node.attr in ATTRIBUTES:
                self._add("frame or gc introspection", f".{node.attr}", node)
            self.generic_visit(node)
            return
        self._name(resolved[0], node, resolved[1], isinstance(node.ctx, ast.Store))
        if resolved[0].endswith(".__dict__") and self._watched(node.value):
            self._add("obfuscation", f"the namespace of {resolved[0][:-9]}", node)
        base: ast.AST = node
        while isinstance(base, ast.Attribute):
            base = base.value
        if not isinstance(base, ast.Name):  # a resolved call or subscript: its parts
            self._visit_resolved(base)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if isinstance(node.ctx, (ast.Store, ast.Del)) and self._watched(node.value) == "sys.modules":
            self._add("the module table", "sys.modules changed", node)
        resolved = self.resolve(node)
        if resolved is not None:
            self._name(resolved[0], node, resolved[1])
            self._visit_resolved(node)
            return
        self.generic_visit(node)

    def _visit_resolved(self, node: ast.AST) -> None:
        """The parts of a resolved call or subscript (``sys.modules`` in
        ``sys.modules["x"]``; ``getattr``'s object)."""
        if isinstance(node, ast.Subscript):
            self.visit(node.value)
        elif isinstance(node, ast.Call):
            self._call(node)

    def visit_Call(self, node: ast.Call) -> None:
        resolved = self.resolve(node)
        if resolved is not None:  # __import__("x"), getattr(m, "x"): the name x
            self._name(resolved[0], node, resolved[1])
        self._call(node)

    def _call(self, node: ast.Call) -> None:
        func = self.resolve(node.func)
        name = func[0].removeprefix("builtins.") if func else None
        self._built_call(name, func, node)
        self._computed_call(name, func, node)
        if name and name.startswith("sys.modules.") and name.rsplit(".", 1)[1] in _SURGERY:
            self._add("the module table", "sys.modules changed", node)
        if not (isinstance(node.func, ast.Name) and node.func.id == "__import__"):
            self.visit(node.func)  # (a literal __import__ is the name it imports)
        for arg in [*node.args, *(k.value for k in node.keywords)]:
            self.visit(arg)

    def _built_call(self, name: str | None, func: tuple[str, bool] | None, node: ast.Call) -> None:
        """A call that runs, imports or reaches a name built from string pieces; a code or
        function builder called; ``pickle.loads`` of a constant."""
        first = node.args[0] if node.args else None
        names = node.args[1] if name in _ATTR_CALLS and len(node.args) >= 2 else first
        if name in _EXECUTORS | _IMPORTERS | _ATTR_CALLS and names is not None and is_built_name(names):
            self._add("obfuscation", f"{name} of a string built from pieces", node)
        if name in _BUILDERS and func and func[1]:
            self._add("obfuscation", f"{name} called", node)
        if name in ("pickle.loads", "_pickle.loads") and fold(first) is not None:
            self._add("obfuscation", "pickle.loads of a constant", node)

    def _computed_call(self, name: str | None, func: tuple[str, bool] | None, node: ast.Call) -> None:
        """exec/eval of code, an import, a get/set/delattr or ``vars`` of a watched module,
        whose argument is computed at run time (literal code is scanned as code)."""
        first = node.args[0] if node.args else None
        if name in _EXECUTORS and (func is None or not func[1] or func[0].startswith("builtins.")):
            code = fold(first) if first is not None else None
            if isinstance(code, str):
                self._literal_code(code, node)
            else:
                self._add("obfuscation", f"{name} of a string built at run time", node)
        elif name in _IMPORTERS and first is not None and fold(first) is None:
            self._add("obfuscation", f"{name} of a name built at run time", node)
        elif name in _ATTR_CALLS and len(node.args) >= 2 and fold(node.args[1]) is None:
            watched = self._watched(node.args[0])
            if watched or _is_module_expr(node.args[0]):
                shown = watched or "a module"
                self._add("obfuscation", f"{name} on {shown} with a computed name", node)
        elif name == "setattr" and len(node.args) >= 2:
            target = self.resolve(node.args[0])
            if target and target[1]:
                self._name(f"{target[0]}.{fold(node.args[1])}", node, True, store=True)
        elif name == "vars" and first is not None and self._watched(first):
            self._add("obfuscation", f"the namespace of {self._watched(first)}", node)

    def _literal_code(self, code: str, node: ast.AST) -> None:
        """exec/eval/compile of a literal: its code is scanned too."""
        try:
            tree = python_ast.parse(code)
        except (SyntaxError, ValueError):
            return  # it raises when run: nothing hidden
        inner = _Scanner(self.own)
        inner.aliases = dict(self.aliases)
        inner.visit(tree)
        line = getattr(node, "lineno", 0)
        self.found += [(key, line) for key, _ in inner.found]


def _is_module_expr(node: ast.AST) -> bool:
    """``__import__(...)``, ``importlib.import_module(...)``, ``sys.modules[...]``."""
    if isinstance(node, ast.Subscript):
        return isinstance(node.value, ast.Attribute) and node.value.attr == "modules"
    if isinstance(node, ast.Call):
        func = node.func
        return (isinstance(func, ast.Name) and func.id == "__import__") or (
            isinstance(func, ast.Attribute) and func.attr in ("import_module", "__import__")
        )
    return False


def constructs(source: str | bytes, own: frozenset[str] = frozenset()) -> list[tuple[str, int]] | None:
    """Every watched construct in ``source`` as (what, line); None if it does not parse."""
    try:
        tree = python_ast.parse(source)
        scanner = _Scanner(own)
        scanner.visit(tree)
        strings = Strings(own)
        strings.visit(tree)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None  # (nested past the interpreter's recursion limit: not scanned)
    return scanner.found + strings.found


def parses(source: str | bytes) -> bool:
    """Whether this interpreter parses ``source``."""
    try:
        python_ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


def is_machinery(own: frozenset[str]) -> bool:
    """Whether the repository is itself test machinery (pytest's own repository): its
    code under test imports tests, walks frames and edits ``sys.modules`` by design."""
    return bool(own & MACHINERY)


def added(
    path: str, before: str | bytes | None, after: str | bytes | None, own: frozenset[str] = frozenset()
) -> list[Finding]:
    """What the patch added to one file: constructs more frequent after than before
    (``before`` None: a new file; ``after`` None: deleted, nothing added). In a
    repository that is itself test machinery only obfuscation counts."""
    if after is None:
        return []
    found = constructs(after, own)
    if found is None:
        return [Finding(path, 0, "not parseable as Python, or nested too deep to scan")]
    if is_machinery(own):
        found = [(key, line) for key, line in found if key.startswith("obfuscation:")]
    old_found = (constructs(before, own) or []) if before else []
    excess = Counter(key for key, _ in found)
    excess.subtract(Counter(key for key, _ in old_found))
    # Which occurrences are the new ones: those whose line is not one the construct
    # was on before (a moved or re-indented line is the same), then the last ones.
    before_lines, after_lines = _lines(before), _lines(after)
    old_lines = Counter((key, _line(before_lines, line)) for key, line in old_found)
    fresh, known = [], []
    for key, line in found:
        if excess[key] <= 0:
            continue
        text = (key, _line(after_lines, line))
        if old_lines[text] > 0:
            old_lines[text] -= 1
            known.append((key, line))
        else:
            fresh.append((key, line))
    chosen = []
    for key, line in fresh + known[::-1]:
        if excess[key] > 0:
            excess[key] -= 1
            chosen.append((line, key))
    return [Finding(path, line, key) for line, key in sorted(chosen)]


def _lines(source: str | bytes | None) -> list[str]:
    if source is None:
        return []
    text = source.decode("utf-8", "replace") if isinstance(source, bytes) else source
    return text.splitlines()


def _line(lines: list[str], number: int) -> str:
    return lines[number - 1].strip() if 0 < number <= len(lines) else ""


def own_packages(names: list[str]) -> frozenset[str]:
    """The repository's own top-level packages from paths relative to its root
    (``x/__init__.py``, ``src/x/__init__.py``, ``lib/x/__init__.py``, ``x.py``)."""
    own = set()
    for path in names:
        parts = path.split("/")
        if parts[0] in ("src", "lib") and len(parts) > 2:
            parts = parts[1:]
        if len(parts) == 2 and parts[1] == "__init__.py":
            own.add(parts[0])
        elif len(parts) == 1 and parts[0].endswith(".py"):
            own.add(parts[0][:-3])
    return frozenset(own)
