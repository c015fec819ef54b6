"""The plugin API: importable from ``rollserve.handlers`` alone, lazily; a task family
written against it runs its stages; the engine's Rollout is the handlers' view of a
rollout; each handler's typed state fails clearly when a stage runs out of order."""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import rollserve.handlers as plugin_api
from rollserve.engine.rollout import Rollout
from rollserve.handlers import (
    AgentHandler,
    Evaluation,
    FinishTool,
    InfraError,
    InvalidInstance,
    RolloutView,
    Tool,
    ToolEnv,
    ToolEnvConfig,
    function_schema,
    run_episode,
)
from rollserve.handlers.registry import builtin_handlers
from tests.source_ast import parse_source

HANDLERS = Path(plugin_api.__file__).parent


# That every plugin-API name is its home module's object, and that __all__, _HOMES and the
# TYPE_CHECKING imports agree, is tests/test_architecture.py's check of every face.


def test_importing_the_package_loads_no_agent_or_engine_module():
    """Scoring workers import handlers.latex and math.scoring: the package itself must
    stay cheap, the plugin API coming on first use."""
    code = (
        "import sys, rollserve.handlers.math.scoring, rollserve.handlers.stem.answers\n"
        "print(sorted(m for m in sys.modules if m.startswith('rollserve.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    loaded = eval(out)
    assert "rollserve.handlers.latex" in loaded
    assert not [
        m for m in loaded if m.startswith(("rollserve.agent", "rollserve.engine", "rollserve.llm", "rollserve.sandbox"))
    ], loaded


def test_no_handler_module_imports_the_engine():
    """handlers/ sees the engine's Rollout only as ``handlers.base.RolloutView``: no
    import of rollserve.engine (nor api, client, commands), not even for type checking."""
    upward = ("rollserve.engine", "rollserve.api", "rollserve.client", "rollserve.commands")
    found = []
    for path in sorted(HANDLERS.rglob("*.py")):
        for node in ast.walk(parse_source(path)):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            found += [f"{path.relative_to(HANDLERS)}: {n}" for n in names if n.startswith(upward)]
    assert found == []


def test_the_engine_s_rollout_is_a_rollout_view(new_rollout):
    rollout = new_rollout({"question": "q", "answer": "1"})
    assert isinstance(rollout, Rollout) and isinstance(rollout, RolloutView)
    assert rollout.sampling is rollout.spec.sampling and rollout.metadata is rollout.spec.metadata
    assert rollout.state is None and rollout.resources.sandboxes == []
    rollout.add_stats({"tool_calls": 2})
    assert rollout.stats == {"tool_calls": 2}


# --- a task family written against rollserve.handlers only ---------------------------------
class Shout(Tool):
    schema = function_schema("shout", "say it loud", {"text": {"type": "string"}}, ["text"])

    async def __call__(self, args):
        return args["text"].upper()


@dataclass
class EchoTask:
    word: str
    answer: str | None = None  # what the agent finished with (RUN)


class EchoHandler(AgentHandler):
    """The agent must shout the instance's word, then finish with it."""

    name = "echo"

    def validate(self, instance):
        if not isinstance(instance.get("word"), str):
            raise InvalidInstance("instance.word", "required: a string")

    async def init(self, rollout):
        self.validate(rollout.instance)
        rollout.state = EchoTask(rollout.instance["word"])

    async def run(self, rollout):
        task = self.state(rollout, EchoTask)
        env = ToolEnv(
            [Shout(), FinishTool()],
            f"Shout {task.word!r}, then finish with it.",
            tokenizer=self.ctx.tokenizer,
            config=ToolEnvConfig(tool_format="json"),
        )
        await run_episode(self.ctx, rollout, env)
        task.answer = env.answer

    async def eval(self, rollout):
        task = self.state(rollout, EchoTask)
        return Evaluation(reward=float(task.answer == task.word))

    async def cleanup(self, rollout):
        pass


async def test_a_plugin_family_runs_its_stages(ctx, new_rollout, scripted):
    replies = ['{"name": "shout", "arguments": {"text": "hi"}}', '{"name": "finish", "arguments": {"answer": "hi"}}']
    handler = EchoHandler(ctx)
    rollout = new_rollout({"word": "hi"}, max_turns=4, llm=scripted(replies))
    with pytest.raises(InfraError, match="echo handler: rollout .* has no EchoTask .*RUN before INIT"):
        await handler.run(rollout)
    await handler.init(rollout)
    await handler.run(rollout)
    assert (await handler.eval(rollout)).reward == 1.0
    assert [m["content"] for m in rollout.trajectory.messages if m["role"] == "tool"][0] == "HI"
    assert [t.tool_calls[0]["name"] for t in rollout.trajectory.turns] == ["shout", "finish"]
    assert rollout.stats["tool_calls"] == 2 and {"llm", "tools"} <= set(rollout.timing)


def readme_example() -> str:
    """The task family the docs show plugin authors (docs/writing-a-family.md: its python
    block that defines EchoHandler)."""
    readme = (HANDLERS.parents[2] / "docs" / "writing-a-family.md").read_text()
    blocks = [b.split("```", 1)[0] for b in readme.split("```python\n")[1:]]
    (block,) = [b for b in blocks if "class EchoHandler(AgentHandler)" in b]
    return block


async def test_the_readme_s_example_family_runs(ctx, new_rollout, scripted):
    namespace: dict = {}
    exec(compile(readme_example(), "docs/writing-a-family.md", "exec"), namespace)
    handler = namespace["EchoHandler"](ctx)
    with pytest.raises(InvalidInstance, match="instance.word"):
        handler.validate({})
    reply = '<tool_call>\n{"name": "finish", "arguments": {"answer": "hi"}}\n</tool_call>'
    rollout = new_rollout({"word": "hi"}, llm=scripted([reply]))
    await handler.init(rollout)
    await handler.run(rollout)
    assert (await handler.eval(rollout)).reward == 1.0 and rollout.trajectory.ended_by == "finished"


# --- the built-ins' typed state ------------------------------------------------------------------
INSTANCES = {
    "math": {"question": "What is 2 + 2?", "answer": "4"},
    "math_python": {"question": "What is 2 + 2?", "answer": "4"},
    "stem": {"question": "Q?", "answer": "4"},
    "code": {"problem": "Print 1.", "tests": [{"input": "", "output": "1\n"}]},
    "swe": {
        "repo": "toy/calc",
        "instance_id": "toy__calc-1",
        "base_commit": "0" * 40,
        "problem_statement": "fix it",
        "FAIL_TO_PASS": ["t::a"],
        "PASS_TO_PASS": [],
    },
}


@pytest.mark.parametrize("name", sorted(INSTANCES))
async def test_a_stage_out_of_order_is_an_infra_error_naming_the_state(name, ctx, new_rollout, scripted):
    handler = builtin_handlers()[name](ctx)
    rollout = new_rollout(INSTANCES[name], llm=scripted(["never sampled"]))
    with pytest.raises(InfraError, match=f"{name} handler: rollout .* has no \\w+ \\(found nothing\\)"):
        await handler.run(rollout)
    with pytest.raises(InfraError, match="RUN before INIT"):
        await handler.eval(rollout)
    assert rollout.trajectory.turns == []  # nothing was sampled
