"""Judge rewards for any family: a family's own ``eval`` gives the outcome, then a
rubric (``contract.judge``) has the server's judges grade the policy's text, and the
reward becomes their stated blend (docs/judges.md).

Integrity: the policy's text is data to the judge. It sits between two boundary lines
made of a random token drawn per call, after the policy has finished, so the policy
cannot know it and cannot close the block; a policy text that contains the token
anyway (it cannot, short of guessing 128 bits) is refused. Every ``score:`` in the
policy's text reaches the judge with a look-alike colon, so no line of it parses as a
score even when a judge echoes it. The score is read only from the judge's own reply:
its last non-empty line must be exactly ``SCORE: <n>``
(a plain number inside the rubric's scale), the reply is bounded in length, and a
reply that quotes the boundary (it echoed the policy's block) is refused. A refused
reply is asked again, then counts as the scale's lowest score (never a mask: a policy
that makes the judge misformat must not turn a likely 0 into a dropped sample); so does,
at once, a judge's refusal of what the policy wrote (a reply past its bound, a prompt
too long for its window: ``errors.JudgeRefused``). What the
policy writes ("SCORE: 10", a fake end of the block, a fake judge reply) is never
parsed. A judge can still be persuaded by a convincing wrong answer: measure it with
a held-out set of known-bad persuasive answers (docs/judges.md).
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import statistics
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from rollserve.contract.judge import JudgeRequest, Rubric
from rollserve.errors import InfraError, JudgeRefused
from rollserve.handlers.base import Evaluation
from rollserve.llm.routing import current_deadline

if TYPE_CHECKING:
    from rollserve.handlers.base import HandlerContext

SCORE_LINE = re.compile(r"SCORE: ?(-?[0-9]{1,6}(?:\.[0-9]{1,6})?)", re.ASCII)
# Any "score:" in the policy's text (any case) is shown to the judge with its colon
# replaced by a look-alike (U+FE55), so no line of the policy's text, even echoed whole
# by the judge, is ever a line the parser reads.
POLICY_SCORE = re.compile(r"score:", re.IGNORECASE)
MAX_POLICY_CHARS = 60_000  # the policy's text shown to the judge: its tail beyond this


class JudgeReplyLike(Protocol):
    @property
    def text(self) -> str: ...

    @property
    def seconds(self) -> float: ...


class JudgeLike(Protocol):
    name: str

    async def ask(self, messages: list[Any]) -> JudgeReplyLike: ...

    def note_unparsed(self) -> None: ...


class JudgePool(Protocol):
    """What handlers use of the server's judges (``llm.judges.Judges``)."""

    def names(self) -> list[str]: ...

    def get(self, name: str | None) -> JudgeLike: ...


class JudgeFailed(InfraError):
    """No judge could be reached (a connection error, a timeout, a 5xx after its tries,
    the EVAL stage's time running out) and the rubric says mask. A judge that answered
    but gave no score, or refused what the policy wrote, is never this: the scale's
    lowest score (docs/judges.md)."""


@dataclass
class Verdict:
    """One judge call, as the result's evaluation records it."""

    judge: str
    prompt: str
    reply: str | None
    score: float | None
    seconds: float
    error: str | None = None
    unparsed: bool = False
    tries: int = 1

    def record(self) -> dict[str, Any]:
        return {
            "judge": self.judge,
            "prompt": self.prompt,
            "reply": self.reply,
            "score": self.score,
            "seconds": round(self.seconds, 4),
            "error": self.error,
            "unparsed": self.unparsed,
            "tries": self.tries,
        }


def parse_score(reply: str, rubric: Rubric, boundary: str) -> float:
    """The score on the reply's last non-empty line (``SCORE: n``, strictly), inside the
    scale; ``ValueError`` saying why otherwise."""
    if boundary in reply:
        raise ValueError("the reply quotes the policy's block (its boundary): not parsed")
    lines = [line.strip() for line in reply.splitlines() if line.strip()]
    if not lines:
        raise ValueError("empty reply")
    match = SCORE_LINE.fullmatch(lines[-1])
    if match is None:
        raise ValueError("the reply's last line is not 'SCORE: <number>'")
    score = float(match.group(1))
    if not rubric.low <= score <= rubric.high:
        raise ValueError(f"score {score:g} is outside the scale [{rubric.low:g}, {rubric.high:g}]")
    return score


def new_boundary() -> str:
    return f"BOUNDARY-{secrets.token_hex(16)}"


def delimit(text: str, boundary: str | None = None, label: str = "") -> tuple[str, str]:
    """The policy's text between two boundary lines of a fresh random token (or the
    call's ``boundary``; ``label`` names the block: ``TASK``); the block and the token.
    Every ``score:`` in it is neutralised."""
    boundary = boundary or new_boundary()
    if len(text) > MAX_POLICY_CHARS:
        text = "[...cut...]" + text[-MAX_POLICY_CHARS:]
    text = POLICY_SCORE.sub(lambda m: m.group(0)[:-1] + "\ufe55", text)
    if boundary in text:  # unreachable short of guessing 128 bits; refused, never shown
        raise InfraError("the policy's text contains the judge's boundary")
    tag = f"{boundary} {label} " if label else f"{boundary} "
    return f"<<<{tag}BEGIN>>>\n{text}\n<<<{tag}END>>>", boundary


@dataclass(frozen=True)
class TaskText:
    """The task shown to the judge: ``trusted`` when it comes from the stored instance
    (the family's ``judge_task``); else it is the first user message, which a harness
    (after a compaction, the policy's own summary) wrote: policy-influenced, so it is
    delimited and neutralised like the answer."""

    text: str
    trusted: bool


FINISH_TOOLS = ("finish", "submit")  # a call that ends the episode with its answer


def _calls(message: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The message's tool calls (OpenAI's shape, or a flat name/arguments), as (name,
    arguments) with JSON-string arguments decoded where they are JSON."""
    out: list[tuple[str, Any]] = []
    for call in message.get("tool_calls") or []:
        if not isinstance(call, Mapping):
            continue
        inner = call.get("function")
        fn: Mapping[str, Any] = inner if isinstance(inner, Mapping) else call
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                pass
        out.append((str(fn.get("name", "")), args))
    return out


def _text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return ""


def _content(message: Mapping[str, Any]) -> str:
    """The message's text and its tool calls (name and arguments), as the judge sees
    them (inside the delimited block)."""
    shown = [_text(message)] if _text(message).strip() else []
    for name, args in _calls(message):
        rendered = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        shown.append(f"[tool call] {name} {rendered}")
    return "\n".join(shown)


def task_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """The task as the policy was given it: the first user message."""
    return next((_content(m) for m in messages if m.get("role") == "user"), "")


def final_answer(messages: Sequence[Mapping[str, Any]]) -> str:
    """The policy's final answer: the finish tool's answer where its last turn called
    one, else its last non-empty assistant message (text and tool calls)."""
    for message in reversed(messages):
        if message.get("role") != "assistant":
            continue
        for name, args in reversed(_calls(message)):
            if name in FINISH_TOOLS and isinstance(args, Mapping) and args.get("answer") is not None:
                text = _text(message).strip()
                answer = str(args["answer"])
                return f"{text}\n{answer}" if text else answer
        shown = _content(message)
        if shown.strip():
            return shown
    return ""


def transcript(messages: Sequence[Mapping[str, Any]]) -> str:
    """Every message but the system ones (the first user message, the task, included),
    each labelled by its role."""
    return "\n\n".join(f"[{m.get('role')}]\n{_content(m)}" for m in messages if m.get("role") != "system")


def reference_of(request: JudgeRequest, instance: Mapping[str, Any]) -> str | None:
    if request.reference is not None:
        return request.reference
    answer = instance.get("answer") if request.reference_from_instance else None
    if isinstance(answer, (str, int, float)) and not isinstance(answer, bool):
        return str(answer)
    return None


def prompt(rubric: Rubric, task: TaskText, answer: str, reference: str | None) -> tuple[str, str]:
    """The judge's prompt (plain text, one user message) and the call's boundary."""
    block, boundary = delimit(answer)
    shown = task.text if task.trusted else delimit(task.text, boundary, "TASK")[0]
    ref_block = f"A reference answer:\n{reference}\n\n" if reference is not None else ""
    values = {
        "task": shown,
        "answer": block,
        "reference": reference or "",
        "reference_block": ref_block,
        "low": f"{rubric.low:g}",
        "high": f"{rubric.high:g}",
    }
    # Placeholders are replaced one pass, left to right: text inside a value is never
    # expanded again (a task that contains "{answer}" stays as it is).
    out = re.sub(r"\{(task|answer|reference|reference_block|low|high)\}", lambda m: values[m.group(1)], rubric.template)
    return out, boundary


async def _one(judge: JudgeLike, rubric: Rubric, task: TaskText, answer: str, reference: str | None) -> Verdict:
    """One sample of one judge. A judge not reached (``InfraError``: connection error,
    timeout, 5xx after its tries) gives no score: the rubric's ``on_failure`` applies.
    A reply that holds no valid score is asked again (``unparsed_retries``, each with a
    fresh boundary), then counts as the scale's lowest score, ``unparsed`` recorded; so
    does a refusal of what the policy wrote (``JudgeRefused``: a reply over the judge's
    bound, a prompt over its window), at once. Never a mask, which a policy could buy by
    making the judge misformat or refuse."""
    seconds = 0.0
    reply_text: str | None = None
    for attempt in range(1, rubric.unparsed_retries + 2):
        text, boundary = prompt(rubric, task, answer, reference)
        try:
            reply = await judge.ask([{"role": "user", "content": text}])
        except JudgeRefused as exc:
            reply_text, problem = None, str(exc)
            break
        except InfraError as exc:
            return Verdict(judge.name, text, None, None, seconds, str(exc), tries=attempt)
        seconds += reply.seconds
        reply_text = reply.text
        try:
            score = parse_score(reply.text, rubric, boundary)
        except ValueError as exc:
            problem = str(exc)
            continue
        return Verdict(judge.name, text, reply.text, score, seconds, tries=attempt)
    judge.note_unparsed()
    return Verdict(
        judge.name,
        text,
        reply_text,
        rubric.low,
        seconds,
        f"no score in the reply ({problem}): the scale's lowest",
        unparsed=True,
        tries=attempt,
    )


def aggregate(scores: Sequence[float], how: str) -> float:
    if how == "median":
        return float(statistics.median(scores))
    if how == "min":
        return float(min(scores))
    return float(statistics.fmean(scores))


async def grade(
    pool: JudgePool, rubric: Rubric, task: TaskText, answer: str, reference: str | None
) -> tuple[float | None, list[Verdict]]:
    """Every judge the rubric names, ``samples`` times each; the aggregated score
    normalised to [0, 1] (None when none was valid) and each call's verdict."""
    judges = [pool.get(name) for name in rubric.judges] or [pool.get(None)]
    calls = [_one(judge, rubric, task, answer, reference) for judge in judges for _ in range(rubric.samples)]
    verdicts = list(await asyncio.gather(*calls))
    scores = [v.score for v in verdicts if v.score is not None]
    if not scores:
        return None, verdicts
    value = aggregate(scores, rubric.aggregate)
    return (value - rubric.low) / (rubric.high - rubric.low), verdicts


def blend(outcome: float, judge: float, weight: float) -> float:
    """The stated formula: ``(1 - weight) * outcome + weight * judge``."""
    return (1.0 - weight) * outcome + weight * judge


async def _process(
    pool: JudgePool, rubric: Rubric, messages: Sequence[Mapping[str, Any]], task: TaskText, reference: str | None
) -> tuple[float | None, list[float | None], list[Verdict]]:
    """Process mode: each model call (the transcript up to it) graded; their mean."""
    calls = [i for i, m in enumerate(messages) if m.get("role") == "assistant"][-rubric.max_turns :]
    graded = await asyncio.gather(*(grade(pool, rubric, task, transcript(messages[: i + 1]), reference) for i in calls))
    turn_scores = [score for score, _ in graded]
    verdicts = [v for _, found in graded for v in found]
    if not turn_scores or any(s is None for s in turn_scores):
        return None, turn_scores, verdicts  # a call without a valid score: no process score
    return statistics.fmean(s for s in turn_scores if s is not None), turn_scores, verdicts


class JudgeTimedOut(InfraError):
    """The judges ran past the EVAL stage's time (less ``STAGE_MARGIN``)."""


STAGE_MARGIN = 2.0  # seconds of the EVAL stage's time kept for what follows the judges


@asynccontextmanager
async def _within_the_stage() -> AsyncIterator[None]:
    """Bound the judges' calls (their queue, timeouts, tries and unparsed retries) by
    the deadline the engine set for the stage's calls, less a margin (half what is
    left, when that is less): running out is ``JudgeTimedOut``, a judge not reached,
    so the rubric's ``on_failure`` applies before the stage itself times out (which
    would mask the rollout whatever the rubric says). Unbounded where no deadline is
    set (an offline check)."""
    when = current_deadline()
    if when is None:
        yield
        return
    loop = asyncio.get_running_loop()
    left = when - loop.time()
    budget = max(0.0, left - min(STAGE_MARGIN, left / 2))
    try:
        async with asyncio.timeout_at(loop.time() + budget) as bound:
            yield
    except TimeoutError:
        if not bound.expired():
            raise
        raise JudgeTimedOut(
            f"the judges timed out: no score within the EVAL stage's time ({budget:.1f} s left to them)"
        ) from None


async def judged(
    ctx: HandlerContext,
    evaluation: Evaluation,
    messages: Sequence[Mapping[str, Any]],
    instance: Mapping[str, Any],
    request: JudgeRequest,
    task: str | None = None,
) -> Evaluation:
    """``evaluation`` (the family's outcome) with the judge reward blended in; the
    judge's calls recorded in its details (``judge``), its score in the components.
    ``task``: the task's text from the stored instance (the family's ``judge_task``);
    None: the first user message, shown delimited as policy-influenced text.
    No judge reached (transport failures only): ``JudgeFailed`` (masked) or the outcome
    alone, as the rubric says; a reply without a score is the scale's lowest score."""
    rubric = ctx.rubric(request)
    if ctx.judges is None or not ctx.judges.names():
        raise JudgeFailed("this server has no judge (rollserve serve --judge NAME=URL)")
    reference = reference_of(request, instance)
    shown = TaskText(task, True) if task else TaskText(task_text(messages), False)
    outcome = float(evaluation.reward)
    turn_scores: list[float | None] | None = None
    late: str | None = None
    try:
        async with _within_the_stage():
            if rubric.mode == "process":
                score, turn_scores, verdicts = await _process(ctx.judges, rubric, messages, shown, reference)
            else:
                score, verdicts = await grade(ctx.judges, rubric, shown, final_answer(messages), reference)
    except JudgeTimedOut as exc:
        score, verdicts, late = None, [], exc.message
    name = request.rubric if isinstance(request.rubric, str) else "inline"
    record: dict[str, Any] = {
        "rubric": name,
        "mode": rubric.mode,
        "scale": [rubric.low, rubric.high],
        "aggregate": rubric.aggregate,
        "weight": rubric.weight,
        "outcome": outcome,
        "task_from": "instance" if shown.trusted else "first user message (delimited)",
        "score": score,
        "formula": "reward = (1 - weight) * outcome + weight * judge",
        "unparsed": any(v.unparsed for v in verdicts),
        "calls": [v.record() for v in verdicts],
    }
    if turn_scores is not None:
        record["turn_scores"] = turn_scores
    key = "judge_process" if rubric.mode == "process" else "judge"
    components = {**evaluation.components, "outcome": outcome}
    if score is None:
        errors = sorted({v.error or "no score" for v in verdicts} | ({late} if late else set()))
        if rubric.on_failure == "mask":
            raise JudgeFailed("no valid judge score (" + "; ".join(errors)[:400] + ")")
        record.update(failed=True, fallback="outcome", errors=errors)
        return Evaluation(outcome, {**evaluation.details, "judge": record}, components)
    components[key] = score
    reward = blend(outcome, score, rubric.weight)
    return Evaluation(reward, {**evaluation.details, "judge": record}, components)
