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

Several distinct final answers (``\\boxed{3} or \\boxed{4}`` in the reply, or in the
finish call) score only if every one of them is right: otherwise 0 with
``{"ambiguous": true}``; more than ``MAX_ANSWERS`` are not scored at all.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rollserve.agent import FinishTool, PythonTool, ToolEnv, ToolEnvConfig
from rollserve.agent.base import Step
from rollserve.errors import InfraError
from rollserve.handlers.base import AgentHandler, Evaluation, HandlerDefaults, InvalidInstance, RolloutView
from rollserve.handlers.episode import run_episode
from rollserve.handlers.latex import boxed_answers, extract_boxed, plain_integer_verdict, verify_math_answer
from rollserve.handlers.math.instances import GymEntry, gym_entry, validate_dataset_form, validate_question_form
from rollserve.handlers.math.prompts import (
    ANSWER_FORMAT,
    FINISH_PARAMETER,
    PYTHON_NUDGE,
    PYTHON_SYSTEM_PROMPT,
    PYTHON_TASK_SUFFIX,
    RETRY_MESSAGE,
    SYSTEM_PROMPT,
)
from rollserve.handlers.math.scoring import generate_reasoning_gym_task, score_reasoning_gym_answer
from rollserve.handlers.sandboxed import close_later, close_sandboxes, find_python, open_sandbox
from rollserve.handlers.scoring import ScoringTimeout, score_in_pool
from rollserve.handlers.single_answer import (
    ANSWER_DEFAULTS,
    AnswerEnv,
    final_answer,
    with_answer_components,
)
from rollserve.sandbox.base import Sandbox, SandboxLimits, SandboxSpec
from rollserve.sandbox.tools import IPythonConfig

TOOLS = ("python",)  # the tools an instance may ask for
MAX_ANSWERS = 3  # distinct final answers scored at most; more are a hedge, scored 0


@dataclass
class MathState:
    """INIT's question and gold answer, for RUN and EVAL."""

    question: str
    system_prompt: str
    gold: str | None  # as the evaluation shows it (a reasoning-gym entry may have none)
    key: GymEntry | str  # what decides: a reasoning-gym entry (its own scorer), or the
    # gold answer of a question (math-verify)
    sandbox: Sandbox | None = None  # the python tool's (python variant only)
    finish_answer: str | None = None  # the python variant's answer, as finish got it


class MathEnv(AnswerEnv[str]):
    """The environment of one math episode: the question, then format reminders."""

    def __init__(self, question: str, system_prompt: str = SYSTEM_PROMPT) -> None:
        super().__init__(question, system_prompt, ANSWER_FORMAT, RETRY_MESSAGE)

    def extract(self, reply: str) -> str | None:
        return extract_boxed(reply)


class MathToolEnv(ToolEnv):
    """The python variant's episode: tool calls until ``finish``; a reply that calls
    no tool but boxes an answer ends the episode with that answer."""

    async def step(self, reply: str) -> Step:
        if not self.parse(reply).has_calls:
            if extract_boxed(reply) is not None:  # the reply itself is the answer:
                self.finished, self.answer = True, reply  # every box in it is read
                return Step(done=True, reason="finished")
        return await super().step(reply)


# --- the handler -----------------------------------------------------------------
class MathHandler(AgentHandler):
    """Single-answer math (and reasoning-gym) tasks, scored by math-verify or the dataset."""

    name = "math"
    defaults = ANSWER_DEFAULTS

    # The python variant's sandbox and kernel (per rollout).
    sandbox_limits = SandboxLimits(memory_mb=2048, pids=64, cpu_seconds=600)
    kernel = IPythonConfig(timeout=30.0)
    always_python = False  # math_python: every instance gets the python tool

    def uses_python(self, instance: Mapping[str, Any]) -> bool:
        return self.always_python or "python" in (instance.get("tools") or [])

    def judge_task(self, instance: Mapping[str, Any]) -> str | None:
        question = instance.get("question")  # (a reasoning-gym instance has none here)
        return question if isinstance(question, str) and question.strip() else None

    def validate(self, instance: Mapping[str, Any]) -> None:
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
                raise InvalidInstance(f"instance.tools[{index}]", f"unknown tool {tool!r} (known: {', '.join(TOOLS)})")
        if "dataset" in instance:
            validate_dataset_form(instance)
        else:
            validate_question_form(instance)

    def rescore_problem(self, instance: Mapping[str, Any]) -> str | None:
        if self.uses_python(instance):
            return (
                f"{self.name} with the python tool: its answer is the finish call's, which "
                "only the run kept; it cannot be re-scored from a stored result"
            )
        return None  # EVAL reads the boxed answer from the messages alone

    async def init(self, rollout: RolloutView) -> None:
        """Materialise the question and gold answer (``MathState``)."""
        instance = rollout.instance
        # Validated again (the API validated at submission) in case the engine skips
        # it on a replay; a reasoning-gym instance in a thread, as its first check
        # imports reasoning-gym (~1 s); a question's checks are a few lookups.
        if isinstance(instance, dict) and "dataset" in instance:
            await asyncio.to_thread(self.validate, instance)
        else:
            self.validate(instance)
        system_prompt = instance.get("system_prompt") or SYSTEM_PROMPT
        key: GymEntry | str
        gold: str | None
        if "dataset" in instance:
            entry = gym_entry(instance, self.ctx.seed_salt)
            what = f"generating reasoning-gym {entry.dataset!r} entry {entry.index}"
            try:
                task = await score_in_pool(self.ctx.scoring, generate_reasoning_gym_task, *entry.args(), what=what)
            except ScoringTimeout as exc:  # the task's fault, not the agent's: masked
                raise InfraError(f"{what} timed out") from exc
            question, gold, key = str(task["question"]), task["answer"], entry
        else:
            question, gold = instance["question"], str(instance["answer"])
            key = gold
        sandbox = None
        if self.uses_python(instance):
            # Threads capped: numpy's OpenBLAS would otherwise start one per host core.
            spec = SandboxSpec(limits=self.sandbox_limits, env={"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"})
            sandbox = await open_sandbox(self.ctx, rollout, spec)
        rollout.state = MathState(question, system_prompt, gold, key, sandbox)

    async def run(self, rollout: RolloutView) -> None:
        state = self.state(rollout, MathState)
        if state.sandbox is not None:
            await self._run_with_python(rollout, state, state.sandbox)
            return
        await run_episode(self.ctx, rollout, MathEnv(state.question, state.system_prompt))

    async def _run_with_python(self, rollout: RolloutView, state: MathState, sandbox: Sandbox) -> None:
        python = PythonTool(sandbox, await find_python(sandbox, self.kernel))
        close_later(rollout, python)
        finish = FinishTool(parameter_description=FINISH_PARAMETER)
        system_prompt = rollout.instance.get("system_prompt") or PYTHON_SYSTEM_PROMPT
        k = self.kernel
        config = ToolEnvConfig(
            call_timeout=k.start_timeout + k.timeout + k.interrupt_grace + 10, nudge_message=PYTHON_NUDGE
        )
        env = MathToolEnv(
            [python, finish],
            f"{state.question}\n\n{PYTHON_TASK_SUFFIX}",
            system_prompt,
            tokenizer=self.ctx.tokenizer,
            config=config,
        )
        try:
            await run_episode(self.ctx, rollout, env)
        finally:
            state.finish_answer = env.answer
        await close_sandboxes(rollout)  # done with it: free it before EVAL

    async def eval(self, rollout: RolloutView) -> Evaluation:
        """The outcome reward, with its components: ``correctness`` (the reward) and
        ``format`` (1.0 when one final answer could be read, boxed or given to finish)."""
        return with_answer_components(await self._eval(rollout))

    async def _eval(self, rollout: RolloutView) -> Evaluation:
        state = self.state(rollout, MathState)
        key = state.key
        python = self.uses_python(rollout.instance)
        if python:
            answers = tool_answers(state.finish_answer)
        else:
            answers = final_answer(rollout.trajectory.messages, lambda text: boxed_answers(text) or None) or []
        details: dict[str, Any] = {
            "extracted": answers[-1] if answers else None,
            "gold": state.gold,
            "method": f"reasoning-gym:{key.dataset}" if isinstance(key, GymEntry) else "math-verify",
            "turns": len(rollout.trajectory.turns),
        }
        if isinstance(key, GymEntry):  # enough to regenerate the entry (handlers.seeds)
            details.update(key.seeding())
        if python:
            details["tools"] = ["python"]
        if len(answers) > 1:
            details["answers"] = answers
        if not answers:
            return Evaluation(reward=0.0, details=details)
        if len(answers) > MAX_ANSWERS:
            details["ambiguous"] = True
            return Evaluation(reward=0.0, details=details)
        try:
            scored = [await self._score(answer, key) for answer in answers]
        except ScoringTimeout:
            # A pathological answer (e.g. 9^{9^{9^{9}}}) is the agent's doing: score it 0.
            details["timeout"] = True
            return Evaluation(reward=0.0, details=details)
        rewards = [reward for reward, _ in scored]
        if not isinstance(key, GymEntry):  # what decided: "integer" only where it decided every answer
            details["method"] = "integer" if all(method == "integer" for _, method in scored) else "math-verify"
        if len(answers) > 1 and min(rewards) < 1.0:
            # Several final answers ("\\boxed{3} or \\boxed{4}") score only if each is right.
            details["ambiguous"] = True
            return Evaluation(reward=0.0, details=details)
        return Evaluation(reward=min(rewards), details=details)

    async def _score(self, answer: str, key: GymEntry | str) -> tuple[float, str]:
        """One answer's reward and what decided it: the dataset's scorer, two plain
        integers compared here ("integer"), or math-verify against the gold."""
        if isinstance(key, GymEntry):
            correct = await score_in_pool(
                self.ctx.scoring,
                score_reasoning_gym_answer,
                answer,
                *key.args(),
                what=f"reasoning-gym {key.dataset!r} scorer",
            )
            return float(correct), f"reasoning-gym:{key.dataset}"
        verdict = plain_integer_verdict(answer, key)  # two integers: no worker needed
        if verdict is not None:
            return (1.0 if verdict else 0.0), "integer"
        correct = await score_in_pool(self.ctx.scoring, verify_math_answer, answer, key, what="math-verify")
        return (1.0 if correct else 0.0), "math-verify"

    async def cleanup(self, rollout: RolloutView) -> None:
        """Close the python variant's kernel and sandbox (the scoring pool is shared)."""
        await close_sandboxes(rollout)


def tool_answer(answer: str | None) -> str | None:
    """The answer given to ``finish``: the content of its last ``\\boxed{}``, else the
    text itself (stripped of a surrounding $...$); None when empty."""
    answers = tool_answers(answer)
    return answers[-1] if answers else None


def tool_answers(answer: str | None) -> list[str]:
    """The distinct answers given to ``finish`` (or in a reply that ended the episode):
    the contents of its ``\\boxed{}``, else the text itself (stripped of a surrounding
    $...$); empty when there is none."""
    if answer is None:
        return []
    boxed = boxed_answers(answer)
    if boxed:
        return boxed
    text = answer.strip()
    if len(text) > 1 and text.startswith("$") and text.endswith("$"):
        text = text.strip("$").strip()
    return [text] if text else []


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
