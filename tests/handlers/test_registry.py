"""HandlerRegistry: built-ins, aliases, entry-point plugins, clear errors."""

from __future__ import annotations

import textwrap

import pytest

from rollserve.handlers.base import HandlerContext
from rollserve.handlers.math.handler import MathHandler
from rollserve.handlers.registry import HandlerRegistry, UnknownDataSource

CTX = HandlerContext(tokenizer=None, scoring=None)  # handlers here never use them


def test_builtin_math_and_aliases_share_one_instance():
    registry = HandlerRegistry()
    assert {"math", "reasoning_gym"} <= set(registry.names())
    handler = registry.create("math", CTX)
    assert isinstance(handler, MathHandler)
    assert registry.create("math", CTX) is handler
    assert registry.create("reasoning_gym", CTX) is handler
    assert registry.handler_class("reasoning-gym") is MathHandler
    # rollserve's own entry points name the built-ins: none is reported as a clash.
    assert registry.load_errors == {}
    assert {"math", "math_python", "code", "stem", "swe", "swebench", "swe-gym", "r2e-gym"} \
        <= set(registry.names())


def test_unknown_name_lists_the_known_ones():
    registry = HandlerRegistry()
    with pytest.raises(UnknownDataSource) as info:
        registry.create("chess", CTX)
    assert isinstance(info.value, KeyError)
    assert str(info.value) == f"unknown data_source 'chess' (known: {', '.join(registry.names())})"
    assert "math" in str(info.value)


class _EchoHandler:
    name = "echo"

    def __init__(self, ctx):
        self.ctx = ctx

    def validate(self, instance): ...

    async def init(self, rollout): ...

    async def run(self, rollout): ...

    async def eval(self, rollout): ...

    async def cleanup(self, rollout): ...


def test_register_in_code():
    registry = HandlerRegistry(discover=False)
    registry.register("echo", _EchoHandler, aliases=("parrot",))
    assert isinstance(registry.create("parrot", CTX), _EchoHandler)
    with pytest.raises(TypeError):
        registry.register("bad", object)


@pytest.fixture
def plugin_dist(tmp_path, monkeypatch):
    """A fake installed distribution declaring handlers in the entry-point group."""
    (tmp_path / "fake_plugin.py").write_text(
        textwrap.dedent(
            """
            class EchoHandler:
                name = "echo"
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
            math = fake_plugin:EchoHandler
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
    # A plugin cannot take over a built-in name.
    assert isinstance(registry.create("math", CTX), MathHandler)
    assert "clashes with the built-in" in registry.load_errors["math"]


def test_broken_plugins_are_reported_not_fatal(plugin_dist):
    registry = HandlerRegistry()
    assert "plugin exploded at import" in registry.load_errors["broken"]
    assert "No module named 'no_such_module_xyz'" in registry.load_errors["missing"]
    assert "not an AgentHandler" in registry.load_errors["number"]
    for name in ("broken", "missing", "number"):
        assert name not in registry.names()
    with pytest.raises(UnknownDataSource) as info:
        registry.create("broken", CTX)
    assert str(info.value).startswith("data_source 'broken' is unavailable: cannot load")
    assert "plugin exploded at import" in str(info.value)
