"""Math word problems: the policy reasons step by step and answers in ``\\boxed{}``.

Instances come in two forms:

- ``{"question": str, "answer": str | number, "system_prompt"?: str}``, the gold
  answer as LaTeX or a number; scored by math-verify (``1/2`` == ``0.5``).
- ``{"dataset": str, "seed": int, "index"?: int, "config"?: dict}``: entry
  ``index`` of a reasoning-gym dataset, generated offline and deterministically
  from the seed; scored by the dataset's own ``score_answer``.

Both forms ask for the final answer in ``\\boxed{}`` (one format, one retry
message). A reply without one gets a user message saying how to format the answer,
up to ``max_turns`` tries. Generation and scoring run in the scoring pool, never in
the event loop.

The python variant (ProRL's math setup) gives the agent tools instead: a persistent
IPython kernel in a sandbox (``python``) and ``finish`` taking the final answer. It is
chosen per instance with ``"tools": ["python"]``, or for every instance by the
``math_python`` data source (the same handler with tool-sized defaults: more turns
and context). The answer is the finish call's (a ``\\boxed{}`` inside it is read
too; a reply that boxes an answer without calling a tool also ends the episode),
scored exactly as above.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from rollserve.agent.base import AgentEnv, Step
from rollserve.agent.sandbox_tools import PythonTool
from rollserve.agent.tool_env import ToolEnv, ToolEnvConfig
from rollserve.agent.tools import FinishTool
from rollserve.errors import InfraError
from rollserve.handlers.base import Evaluation, HandlerContext, HandlerDefaults, InvalidInstance
from rollserve.handlers.math.instances import (entry_args, validate_dataset_form,
                                               validate_question_form, dataset_source)
from rollserve.handlers.math.scoring import (
    extract_boxed,
    generate_reasoning_gym_task,
    score_reasoning_gym_answer,
    verify_math_answer,
)
from rollserve.handlers.sandboxed import (close_later, close_sandboxes, find_python, open_sandbox,
                                          run_episode)
from rollserve.handlers.scoring import ScoringTimeout
from rollserve.sandbox.base import SandboxLimits, SandboxSpec
from rollserve.sandbox.tools.ipython import IPythonConfig

if TYPE_CHECKING:
    from rollserve.engine.rollout import Rollout

SYSTEM_PROMPT = (
    "You are a careful math assistant. Solve the problem step by step, "
    "then write the final answer in \\boxed{}."
)
ANSWER_FORMAT = "Reason step by step, then put your final answer in \\boxed{}, for example \\boxed{42}."
RETRY_MESSAGE = (
    "I could not find a final answer in your reply. Please write your final answer "
    "inside \\boxed{}, for example \\boxed{42}."
)

PYTHON_SYSTEM_PROMPT = (
    "You are a careful math assistant with a Python interpreter. Solve the problem step "
    "by step. Use the python tool to calculate and to check your reasoning (sympy and the "
    "standard library are available; print what you need to see). When you are sure, call "
    "finish with the final answer only, for example 42 or \\frac{1}{2}."
)
PYTHON_TASK_SUFFIX = "Use the python tool to compute; when you are sure, call finish with your final answer."
PYTHON_NUDGE = (
    "Your reply did not call a tool. Call python to compute, or call finish with your "
    "final answer."
)
TOOLS = ("python",)  # the tools an instance may ask for


class MathEnv(AgentEnv):
    """The environment of one math episode: the question, then format reminders.

    A subclass (``handlers.stem.StemEnv``) changes what counts as an answer by
    overriding ``extract`` and the two texts that ask for one.
    """

    answer_format = ANSWER_FORMAT  # closes the question message
    retry_message = RETRY_MESSAGE  # the reply to a reply without an answer

    def __init__(self, question: str, system_prompt: str = SYSTEM_PROMPT):
        self.question = question
        self.system_prompt = system_prompt
        self.answer: str | None = None
        self.malformed_replies = 0

    def initial_messages(self) -> list[dict]:
        return [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": f"{self.question}\n\n{self.answer_format}"},
        ]

    def extract(self, reply: str) -> str | None:
        """The final answer in ``reply``, or None when it gives none."""
        return extract_boxed(reply)

    async def step(self, reply: str) -> Step:
        answer = self.extract(reply)
        if answer is not None:
            self.answer = answer
            return Step(done=True, reason="finished")
        self.malformed_replies += 1
        return Step(messages=[{"role": "user", "content": self.retry_message}])


class MathToolEnv(ToolEnv):
    """The python variant's episode: tool calls until ``finish``; a reply that calls
    no tool but boxes an answer ends the episode with that answer."""

    async def step(self, reply: str) -> Step:
        if not self.parse(reply).has_calls:
            boxed = extract_boxed(reply)
            if boxed is not None:
                self.finished, self.answer = True, boxed
                return Step(done=True, reason="finished")
        return await super().step(reply)


# --- the handler -----------------------------------------------------------------
class MathHandler:
    """Single-answer math (and reasoning-gym) tasks, scored by math-verify or the dataset."""

    name = "math"
    defaults = HandlerDefaults(
        max_turns=3,
        max_context_tokens=2048,
        init_timeout=30.0,
        run_timeout=300.0,
        eval_timeout=30.0,
        total_timeout=600.0,
    )

    # The python variant's sandbox and kernel (per rollout).
    sandbox_limits = SandboxLimits(memory_mb=2048, pids=64, cpu_seconds=600)
    kernel = IPythonConfig(timeout=30.0)
    always_python = False  # math_python: every instance gets the python tool

    def __init__(self, ctx: HandlerContext):
        self.ctx = ctx

    def uses_python(self, instance: dict[str, Any]) -> bool:
        return self.always_python or "python" in (instance.get("tools") or [])

    def validate(self, instance: dict[str, Any]) -> None:
        if not isinstance(instance, dict):
            raise InvalidInstance("instance", "must be an object")
        if "dataset" in instance and "question" in instance:
            raise InvalidInstance(
                "instance", "give either 'question' and 'answer', or a reasoning-gym 'dataset', not both"
            )
        system_prompt = instance.get("system_prompt")
        if system_prompt is not None and not isinstance(system_prompt, str):
            raise InvalidInstance("instance.system_prompt", "must be a string")
        tools = instance.get("tools", [])
        if not isinstance(tools, list) or not all(isinstance(t, str) for t in tools):
            raise InvalidInstance("instance.tools", f"must be a list of tool names ({', '.join(TOOLS)})")
        for index, tool in enumerate(tools):
            if tool not in TOOLS:
                raise InvalidInstance(f"instance.tools[{index}]",
                                      f"unknown tool {tool!r} (known: {', '.join(TOOLS)})")
        if "dataset" in instance:
            validate_dataset_form(instance)
        else:
            validate_question_form(instance)

    async def init(self, rollout: "Rollout") -> None:
        """Materialise the question and gold answer into ``rollout.state``."""
        instance = rollout.instance
        # Validated again (the API validated at submission) in case the engine skips
        # it on a replay; in a thread, as the first reasoning-gym check imports it (~1 s).
        await asyncio.to_thread(self.validate, instance)
        state: dict[str, Any] = {"system_prompt": instance.get("system_prompt") or SYSTEM_PROMPT}
        if "dataset" in instance:
            source = dataset_source(instance)
            what = f"generating reasoning-gym {source['dataset']!r} entry {source['index']}"
            try:
                task = await self._in_pool(generate_reasoning_gym_task, *entry_args(source), what=what)
            except ScoringTimeout as exc:  # the task's fault, not the agent's: masked
                raise InfraError(f"{what} timed out") from exc
            state.update(question=task["question"], gold=task["answer"], source=source)
        else:
            state.update(question=instance["question"], gold=str(instance["answer"]), source=None)
        rollout.state.update(state)
        if self.uses_python(instance):
            # Threads capped: numpy's OpenBLAS would otherwise start one per host core.
            spec = SandboxSpec(limits=self.sandbox_limits,
                               env={"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"})
            rollout.state["sandbox"] = await open_sandbox(self.ctx, rollout, spec)

    async def run(self, rollout: "Rollout") -> None:
        if rollout.llm is None:
            raise InfraError("no LLM session was attached to the rollout before RUN")
        if "question" not in rollout.state:
            raise InfraError("math handler: RUN before INIT (no question in rollout.state)")
        if self.uses_python(rollout.instance):
            await self._run_with_python(rollout)
            return
        env = MathEnv(rollout.state["question"], rollout.state["system_prompt"])
        await run_episode(self.ctx, rollout, env)

    async def _run_with_python(self, rollout: "Rollout") -> None:
        sandbox = rollout.state.get("sandbox")
        if sandbox is None:
            raise InfraError("math handler: RUN before INIT (no sandbox for the python tool)")
        python = PythonTool(sandbox, await find_python(sandbox, self.kernel))
        close_later(rollout, python)
        finish = FinishTool(parameter_description="your final answer, e.g. 42 or \\frac{1}{2}")
        system_prompt = rollout.instance.get("system_prompt") or PYTHON_SYSTEM_PROMPT
        k = self.kernel
        config = ToolEnvConfig(call_timeout=k.start_timeout + k.timeout + k.interrupt_grace + 10,
                               nudge_message=PYTHON_NUDGE)
        env = MathToolEnv([python, finish], f"{rollout.state['question']}\n\n{PYTHON_TASK_SUFFIX}",
                          system_prompt, tokenizer=self.ctx.tokenizer, config=config)
        try:
            await run_episode(self.ctx, rollout, env)
        finally:
            rollout.state["finish_answer"] = env.answer
        await close_sandboxes(rollout)  # done with it: free it before EVAL

    async def eval(self, rollout: "Rollout") -> Evaluation:
        state = rollout.state
        source = state.get("source")
        python = self.uses_python(rollout.instance)
        if python:
            answer = tool_answer(state.get("finish_answer"))
        else:
            answer = final_answer(rollout.trajectory.messages)
        details: dict[str, Any] = {
            "extracted": answer,
            "gold": state.get("gold"),
            "method": f"reasoning-gym:{source['dataset']}" if source else "math-verify",
            "turns": len(rollout.trajectory.turns),
        }
        if python:
            details["tools"] = ["python"]
        if answer is None:
            return Evaluation(reward=0.0, details=details)
        try:
            if source:
                what = f"reasoning-gym {source['dataset']!r} scorer"
                reward = await self._in_pool(score_reasoning_gym_answer, answer, *entry_args(source), what=what)
            else:
                correct = await self._in_pool(verify_math_answer, answer, state["gold"], what="math-verify")
                reward = 1.0 if correct else 0.0
        except ScoringTimeout:
            # A pathological answer (e.g. 9^{9^{9^{9}}}) is the agent's doing: score it 0.
            details["timeout"] = True
            return Evaluation(reward=0.0, details=details)
        return Evaluation(reward=reward, details=details)

    async def cleanup(self, rollout: "Rollout") -> None:
        """Close the python variant's kernel and sandbox (the scoring pool is shared)."""
        await close_sandboxes(rollout)

    async def _in_pool(self, fn: Any, *args: Any, what: str) -> Any:
        return await in_scoring_pool(self.ctx, fn, *args, what=what)


async def in_scoring_pool(ctx: HandlerContext, fn: Any, *args: Any, what: str) -> Any:
    """Run ``fn`` in the scoring pool. Its own exceptions (a generator or scorer
    bug) are infrastructure, never a verdict on the agent; a timeout is
    re-raised for the caller to judge."""
    try:
        return await ctx.scoring.score(fn, *args)
    except (ScoringTimeout, InfraError):
        raise
    except Exception as exc:
        raise InfraError(f"{what} failed: {type(exc).__name__}: {exc}") from exc


def final_answer(messages: list[dict], extract: Any = extract_boxed) -> str | None:
    """The answer (by default the boxed one) of the last assistant message that has one."""
    for message in reversed(messages):
        if message.get("role") == "assistant":
            answer = extract(message.get("content") or "")
            if answer is not None:
                return answer
    return None


def tool_answer(answer: str | None) -> str | None:
    """The answer given to ``finish``: the content of a ``\\boxed{}`` in it, else the
    text itself (stripped of a surrounding $...$); None when empty."""
    if answer is None:
        return None
    boxed = extract_boxed(answer)
    text = (boxed if boxed is not None else answer).strip()
    if len(text) > 1 and text.startswith("$") and text.endswith("$"):
        text = text.strip("$").strip()
    return text or None


class MathPythonHandler(MathHandler):
    """``math_python``: math with the python tool for every instance (ProRL's setup),
    with defaults sized for tool use."""

    name = "math_python"
    always_python = True
    defaults = HandlerDefaults(
        max_turns=8,
        max_context_tokens=4096,
        init_timeout=60.0,
        run_timeout=600.0,
        eval_timeout=30.0,
        total_timeout=900.0,
    )

