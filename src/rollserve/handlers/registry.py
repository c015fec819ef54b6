"""data_source -> AgentHandler: the built-in task families plus plugins.

The built-ins are one table in code (``builtin_handlers``), so they are there
whatever the installed package metadata says (a source tree on ``PYTHONPATH``, a
vendored copy, metadata older than the code), and registered once. A plugin package
adds a task family without forking rollserve by declaring an entry point in the
``rollserve.handlers`` group, naming a subclass of ``rollserve.handlers.AgentHandler``::

    [project.entry-points."rollserve.handlers"]
    my_task = "my_package.handlers:MyHandler"

The registry imports every plugin once, when it is built, so a broken plugin is
reported at server start (``load_errors``, a log warning, and a clear message when
a request names it) instead of crashing the server or failing later. A plugin may
not take over a built-in name or alias.
"""

from __future__ import annotations

import inspect
import logging
from importlib.metadata import entry_points

from rollserve.handlers.base import AgentHandler, HandlerContext

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "rollserve.handlers"

# Other names trainers use for the built-in task families.
BUILTIN_ALIASES: dict[str, str] = {
    "reasoning_gym": "math",
    "reasoning-gym": "math",
    # SWE datasets by the names trainers use (ProRL's default data_source is swebench).
    "swebench": "swe",
    "swe-bench": "swe",
    "swe_bench": "swe",
    "swe-gym": "swe",
    "swe_gym": "swe",
    "r2e-gym": "swe",
    "r2e_gym": "swe",
    "swe-mini": "swe",
}


class UnknownDataSource(KeyError):
    """No handler serves this data_source; the message lists the known ones."""

    def __init__(self, name: str, known: list[str], reason: str | None = None):
        self.name = name
        self.known = known
        self.reason = reason
        if reason:
            message = f"data_source {name!r} is unavailable: {reason}"
        else:
            message = f"unknown data_source {name!r} (known: {', '.join(known) or 'none'})"
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:  # KeyError would print the message with quotes around it
        return self.message


def builtin_handlers() -> dict[str, type[AgentHandler]]:
    """The built-in task families by data_source name: the one table of them
    (imported when a registry is built, not when this module is)."""
    from rollserve.handlers.code.handler import CodeHandler
    from rollserve.handlers.gateway import GatewayHandler
    from rollserve.handlers.harbor.handler import HarborHandler
    from rollserve.handlers.math.handler import MathHandler, MathPythonHandler
    from rollserve.handlers.stem.handler import StemHandler
    from rollserve.handlers.swe.handler import SWEHandler

    return {
        "math": MathHandler,
        "math_python": MathPythonHandler,
        "code": CodeHandler,
        "stem": StemHandler,
        "swe": SWEHandler,
        "gateway": GatewayHandler,
        "harbor": HarborHandler,
    }


def handler_problem(obj: object) -> str | None:
    """Why ``obj`` cannot be registered as a handler class, or None if it can."""
    if not (isinstance(obj, type) and issubclass(obj, AgentHandler)):
        return "not an AgentHandler class (subclass rollserve.handlers.AgentHandler)"
    if inspect.isabstract(obj):
        missing = ", ".join(sorted(obj.__abstractmethods__))
        return f"an AgentHandler class that does not implement {missing}"
    return None


class HandlerRegistry:
    """Maps a data_source name to a handler class, and caches one instance per name."""

    def __init__(self, discover: bool = True) -> None:
        self._builtins = builtin_handlers()
        self._classes: dict[str, type[AgentHandler]] = dict(self._builtins)
        self._aliases: dict[str, str] = dict(BUILTIN_ALIASES)
        self._instances: dict[str, AgentHandler] = {}
        self.load_errors: dict[str, str] = {}  # plugin name -> why it could not be loaded
        if discover:
            self.discover()

    # --- registration -------------------------------------------------------
    def register(self, name: str, handler_cls: type[AgentHandler], aliases: tuple[str, ...] = ()) -> None:
        """Register (or replace) a handler class in code; replaces any cached instance."""
        problem = handler_problem(handler_cls)
        if problem is not None:
            raise TypeError(f"{handler_cls!r} is {problem}")
        self._classes[name] = handler_cls
        self._instances.pop(name, None)
        self.load_errors.pop(name, None)
        for alias in aliases:
            self._aliases[alias] = name

    def discover(self) -> None:
        """Load handlers declared in the ``rollserve.handlers`` entry-point group.

        A plugin may not take over a built-in name or alias (that would silently
        change what an existing data_source means).
        """
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            builtin = self._builtins.get(ep.name)
            if builtin is not None and ep.value == f"{builtin.__module__}:{builtin.__qualname__}":
                continue  # an install made before the built-ins left the entry points
            if builtin is not None or ep.name in self._aliases:
                self.load_errors[ep.name] = (
                    f"entry point {ep.value!r} clashes with the built-in handler {ep.name!r}; ignored"
                )
                log.warning("handler plugin %s: %s", ep.name, self.load_errors[ep.name])
                continue
            try:
                handler_cls = ep.load()
            except Exception as exc:  # an ImportError, or any error the plugin raises at import
                self.load_errors[ep.name] = f"cannot load {ep.value!r}: {type(exc).__name__}: {exc}"
                log.warning("handler plugin %s: %s", ep.name, self.load_errors[ep.name])
                continue
            problem = handler_problem(handler_cls)
            if problem is not None:
                self.load_errors[ep.name] = f"{ep.value!r} is {problem}"
                log.warning("handler plugin %s: %s", ep.name, self.load_errors[ep.name])
                continue
            self._classes[ep.name] = handler_cls
            self.load_errors.pop(ep.name, None)

    # --- lookup ---------------------------------------------------------------
    def names(self) -> list[str]:
        """Every data_source name that resolves to a handler (aliases included)."""
        return sorted(set(self._classes) | {a for a, target in self._aliases.items() if target in self._classes})

    def resolve(self, name: str) -> str:
        """The canonical handler name for ``name`` (an alias or itself)."""
        canonical = self._aliases.get(name, name)
        if canonical in self._classes:
            return canonical
        raise UnknownDataSource(name, self.names(), reason=self.load_errors.get(canonical))

    def handler_class(self, name: str) -> type[AgentHandler]:
        return self._classes[self.resolve(name)]

    def create(self, name: str, ctx: HandlerContext) -> AgentHandler:
        """The handler for ``name``, built with ``ctx`` on first use and then reused
        (aliases share one instance). Raises ``UnknownDataSource``."""
        canonical = self.resolve(name)
        handler = self._instances.get(canonical)
        if handler is None:
            handler = self._classes[canonical](ctx)
            self._instances[canonical] = handler
        return handler
