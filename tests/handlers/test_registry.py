"""HandlerRegistry: built-ins (one table), aliases, entry-point plugins, clear errors."""

from __future__ import annotations

import textwrap
import tomllib
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from rollserve.handlers import registry as registry_module
from rollserve.handlers.base import AgentHandler, Evaluation, HandlerContext
from rollserve.handlers.math.handler import MathHandler
from rollserve.handlers.registry import ENTRY_POINT_GROUP, HandlerRegistry, UnknownDataSource, builtin_handlers

CTX = HandlerContext(tokenizer=None, scoring=None)  # handlers here never use them


def test_builtin_math_and_aliases_share_one_instance():
    registry = HandlerRegistry()
    assert {"math", "reasoning_gym"} <= set(registry.names())
    handler = registry.create("math", CTX)
    assert isinstance(handler, MathHandler)
    assert registry.create("math", CTX) is handler
    assert registry.create("reasoning_gym", CTX) is handler
    assert registry.handler_class("reasoning-gym") is MathHandler
    assert registry.load_errors == {}
    assert {"math", "math_python", "code", "stem", "swe", "swebench", "swe-gym", "r2e-gym"} <= set(registry.names())


def test_builtins_are_registered_once_from_the_table():
    """The built-ins come from one table in code, named as their classes say, and the
    installed metadata declares none of them (they were registered twice before)."""
    table = builtin_handlers()
    assert set(table) == {"math", "math_python", "code", "stem", "swe", "gateway", "harbor"}
    assert all(cls.name == name and issubclass(cls, AgentHandler) for name, cls in table.items())
    declared = {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)}
    assert not declared & set(table), declared
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert ENTRY_POINT_GROUP not in pyproject["project"].get("entry-points", {})


def test_builtins_need_no_package_metadata(monkeypatch):
    """A source tree on PYTHONPATH, or metadata older than the code: no entry points
    at all, and every built-in is still there."""
    monkeypatch.setattr(registry_module, "entry_points", lambda group: [])
    registry = HandlerRegistry()
    assert {"math", "math_python", "code", "stem", "swe", "swebench"} <= set(registry.names())
    assert registry.handler_class("swe-gym") is builtin_handlers()["swe"]


def test_unknown_name_lists_the_known_ones():
    registry = HandlerRegistry()
    with pytest.raises(UnknownDataSource) as info:
        registry.create("chess", CTX)
    assert isinstance(info.value, KeyError)
    assert str(info.value) == f"unknown data_source 'chess' (known: {', '.join(registry.names())})"
    assert "math" in str(info.value)


class _EchoHandler(AgentHandler):
    name = "echo"

    def validate(self, instance): ...

    async def init(self, rollout): ...

    async def run(self, rollout): ...

    async def eval(self, rollout):
        return Evaluation(reward=0.0)

    async def cleanup(self, rollout): ...


class _DuckHandler:
    """Every method, but not an AgentHandler: the contract is declared, not probed."""

    name = "duck"

    def __init__(self, ctx): ...

    def validate(self, instance): ...

    async def init(self, rollout): ...

    async def run(self, rollout): ...

    async def eval(self, rollout): ...

    async def cleanup(self, rollout): ...


class _HalfHandler(AgentHandler):
    name = "half"

    def validate(self, instance): ...


def test_register_in_code():
    registry = HandlerRegistry(discover=False)
    registry.register("echo", _EchoHandler, aliases=("parrot",))
    echo = registry.create("parrot", CTX)
    assert isinstance(echo, _EchoHandler) and echo.ctx is CTX
    assert echo.images({"any": "instance"}) == []  # the contract's default: no images
    with pytest.raises(TypeError, match="not an AgentHandler class"):
        registry.register("bad", object)
    with pytest.raises(TypeError, match="not an AgentHandler class"):
        registry.register("duck", _DuckHandler)
    with pytest.raises(TypeError, match="does not implement cleanup, eval, init, run"):
        registry.register("half", _HalfHandler)


@pytest.fixture
def plugin_dist(tmp_path, monkeypatch):
    """A fake installed distribution declaring handlers in the entry-point group."""
    (tmp_path / "fake_plugin.py").write_text(
        textwrap.dedent(
            """
            from rollserve.handlers import AgentHandler

            class EchoHandler(AgentHandler):
                name = "echo"
                def validate(self, instance): pass
                async def init(self, rollout): pass
                async def run(self, rollout): pass
                async def eval(self, rollout): pass
                async def cleanup(self, rollout): pass

            class DuckHandler:  # the methods, but not the contract
                def __init__(self, ctx): self.ctx = ctx
                def validate(self, instance): pass
                async def init(self, rollout): pass
                async def run(self, rollout): pass
                async def eval(self, rollout): pass
                async def cleanup(self, rollout): pass

            not_a_handler = 42
            """
        )
    )
    (tmp_path / "fake_broken_plugin.py").write_text("raise RuntimeError('plugin exploded at import')\n")
    dist = tmp_path / "fake_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        textwrap.dedent(
            """
            [rollserve.handlers]
            echo = fake_plugin:EchoHandler
            broken = fake_broken_plugin:Handler
            missing = no_such_module_xyz:Handler
            number = fake_plugin:not_a_handler
            duck = fake_plugin:DuckHandler
            math = fake_plugin:EchoHandler
            swebench = fake_plugin:EchoHandler
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_entry_point_plugins_are_discovered(plugin_dist):
    registry = HandlerRegistry()
    assert "echo" in registry.names()
    echo = registry.create("echo", CTX)
    assert type(echo).__name__ == "EchoHandler" and echo.ctx is CTX
    # A plugin cannot take over a built-in name or alias.
    assert isinstance(registry.create("math", CTX), MathHandler)
    assert "clashes with the built-in" in registry.load_errors["math"]
    assert "clashes with the built-in" in registry.load_errors["swebench"]
    assert registry.handler_class("swebench") is builtin_handlers()["swe"]


def test_broken_plugins_are_reported_not_fatal(plugin_dist):
    registry = HandlerRegistry()
    assert "plugin exploded at import" in registry.load_errors["broken"]
    assert "No module named 'no_such_module_xyz'" in registry.load_errors["missing"]
    assert "not an AgentHandler" in registry.load_errors["number"]
    assert registry.load_errors["duck"] == (
        "'fake_plugin:DuckHandler' is not an AgentHandler class (subclass rollserve.handlers.AgentHandler)"
    )
    for name in ("broken", "missing", "number", "duck"):
        assert name not in registry.names()
    with pytest.raises(UnknownDataSource) as info:
        registry.create("broken", CTX)
    assert str(info.value).startswith("data_source 'broken' is unavailable: cannot load")
    assert "plugin exploded at import" in str(info.value)
