"""The math handler's python variant: IPython in a sandbox + finish (ProRL's math setup)."""

from __future__ import annotations

import pytest

from rollserve.agent.tool_calls import format_tool_call
from rollserve.handlers.base import HandlerContext, InvalidInstance
from rollserve.handlers.math.handler import MathHandler, MathPythonHandler, tool_answer
from rollserve.handlers.registry import HandlerRegistry
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from rollserve.sandbox.registry import LazyRuntime

QUESTION = {"question": "What is 2 to the power 10?", "answer": "1024", "tools": ["python"]}

needs_bwrap = pytest.mark.skipif(
    BubblewrapRuntime.unavailable_reason() is not None,
    reason=f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}",
)


def call(name, **args):
    return format_tool_call(name, args)


@pytest.fixture
def sandboxed_ctx(ctx, tmp_path, ipython_in_bubblewrap) -> HandlerContext:
    return HandlerContext(
        tokenizer=ctx.tokenizer, scoring=ctx.scoring, sandboxes=LazyRuntime("bubblewrap", tmp_path / "state")
    )


def test_tools_are_validated(tokenizer):
    handler = MathHandler(HandlerContext(tokenizer=tokenizer, scoring=None))
    handler.validate(QUESTION)
    for tools, field in ((["bash"], "instance.tools[0]"), ("python", "instance.tools"), ([1], "instance.tools")):
        with pytest.raises(InvalidInstance) as info:
            handler.validate({**QUESTION, "tools": tools})
        assert info.value.field == field


def test_math_python_is_a_data_source_with_tool_sized_defaults(tokenizer):
    registry = HandlerRegistry(discover=False)
    assert registry.resolve("math_python") == "math_python"
    handler = registry.create("math_python", HandlerContext(tokenizer=tokenizer, scoring=None))
    assert isinstance(handler, MathPythonHandler) and handler.uses_python({"question": "q"})
    assert handler.defaults.max_turns > MathHandler.defaults.max_turns
    assert not MathHandler(handler.ctx).uses_python({"question": "q"})


def test_the_finish_answer_is_read_boxed_or_plain():
    assert tool_answer("1024") == "1024"
    assert tool_answer("The answer is \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert tool_answer(" $x=3$ ") == "x=3"
    assert tool_answer("  ") is None and tool_answer(None) is None


async def run_episode(handler, rollout):
    try:
        await handler.init(rollout)
        await handler.run(rollout)
        assert handler.ctx.sandboxes.open_sandboxes() == []  # closed at the end of RUN
        return await handler.eval(rollout)
    finally:
        await handler.cleanup(rollout)


@needs_bwrap
async def test_compute_in_python_then_finish(sandboxed_ctx, new_rollout, scripted):
    replies = [
        "Let me compute it.\n" + call("python", code="x = 2 ** 10\nprint(x)"),
        call("python", code="x + 0"),
        "So the answer is 1024.\n" + call("finish", answer="\\boxed{1024}"),
    ]
    rollout = new_rollout(QUESTION, max_turns=5, max_context_tokens=4096, llm=scripted(replies))
    evaluation = await run_episode(MathHandler(sandboxed_ctx), rollout)
    tools = [m["content"] for m in rollout.trajectory.messages if m["role"] == "tool"]
    assert "1024" in tools[0] and "Out[2]: 1024" in tools[1]
    assert rollout.trajectory.ended_by == "finished"
    assert evaluation.reward == 1.0 and evaluation.details["extracted"] == "1024"
    assert rollout.stats["tool_calls"] == 3 and rollout.timing["tools"] > 0


@needs_bwrap
async def test_a_wrong_finish_scores_zero_and_a_boxed_reply_also_ends(sandboxed_ctx, new_rollout, scripted):
    handler = MathPythonHandler(sandboxed_ctx)
    wrong = new_rollout(
        {"question": "What is 6 * 7?", "answer": "42"}, max_turns=4, llm=scripted([call("finish", answer="41")])
    )
    assert (await run_episode(handler, wrong)).reward == 0.0
    boxed = new_rollout(
        {"question": "What is 6 * 7?", "answer": "42"}, max_turns=4, llm=scripted(["Easy: \\boxed{42}"])
    )
    evaluation = await run_episode(handler, boxed)
    assert evaluation.reward == 1.0 and boxed.trajectory.ended_by == "finished"
    never = new_rollout(
        {"question": "What is 6 * 7?", "answer": "42"}, max_turns=2, llm=scripted(["Hmm.", "Still thinking."])
    )
    evaluation = await run_episode(handler, never)
    assert evaluation.reward == 0.0 and evaluation.details["extracted"] is None
    assert never.trajectory.ended_by == "max_turns"
