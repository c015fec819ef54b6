"""Science questions: multiple choice (MMLU, GPQA) and short answers.

The policy reasons, then ends with ``Answer: X`` (a letter) or ``Answer: <value>``;
the usual variants are read too (``stem.answers``). A reply without an answer gets
a user message saying how to give one, up to ``max_turns`` tries (as in ``math``).
The reward is exact: 1.0 if right, else 0.0; a final answer that names more than
one choice ("A or B") is ambiguous and scores 0 (``stem.answers``). Instance shapes, told apart by their
fields:

- MMLU: ``{"question", "choices": [2-10 strings], "answer": 0-based index | "A".."J",
  "subject"?}``
- GPQA: ``{"Question", "Correct Answer", "Incorrect Answer 1".."3", "Subdomain"?,
  "High-level domain"?, "shuffle_seed"?}``; the four answers are shuffled
  deterministically (seeded by the question text, or ``shuffle_seed``), so an
  instance always has the same correct letter.
- Short answer: ``{"question", "answer": str | number, "answer_type"?: "number" |
  "exact" | "expression", "tolerance"?}``; ``number`` is within ``tolerance``
  (relative, default 1e-2) and the default when the answer is a number, else ``exact``
  (case, space and punctuation folded); ``expression`` is math-verify.

Every shape takes ``instructions`` (replaces the answer-format sentence) and
``system_prompt``. Scoring runs in the scoring pool, like math's.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rollserve.handlers.base import AgentHandler, Evaluation, InvalidInstance, RolloutView
from rollserve.handlers.episode import run_episode
from rollserve.handlers.scoring import ScoringTimeout, score_in_pool
from rollserve.handlers.single_answer import (
    ANSWER_DEFAULTS,
    AnswerEnv,
    final_answer,
    with_answer_components,
)
from rollserve.handlers.stem.answers import (
    DEFAULT_TOLERANCE,
    LETTERS,
    Reading,
    is_numeric_answer,
    read_answer,
    score_stem_answer,
)
from rollserve.handlers.stem.prompts import SYSTEM_PROMPT, choice_format, retry_message, value_format

ANSWER_TYPES = ("number", "exact", "expression")
GPQA_INCORRECT = ("Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")
GPQA_FIELDS = ("Question", "Correct Answer", *GPQA_INCORRECT)


@dataclass
class StemQuestion:
    """A validated instance as its episode and its evaluation need it (``prepare``);
    the handler's state, from INIT on."""

    question: str  # the prompt text: subject, question, lettered choices
    spec: dict[str, Any]  # how the answer is read and scored (``stem.answers``: a plain
    # dict, as it crosses to scoring workers)
    shape: str  # gpqa | mmlu | short
    subject: str | None
    answer_format: str
    system_prompt: str


class StemEnv(AnswerEnv[Reading]):
    """One STEM episode: the question (with lettered choices), then format reminders."""

    def __init__(self, question: str, system_prompt: str, spec: dict[str, Any], answer_format: str) -> None:
        super().__init__(question, system_prompt, answer_format, retry_message(spec))
        self.spec = spec

    def extract(self, reply: str) -> Reading | None:
        # A hedge ("A or B") is an answer too: it ends the episode, and scores 0.
        return read_answer(reply, self.spec)


# --- instance shapes ----------------------------------------------------------------
def instance_shape(instance: Mapping[str, Any]) -> str:
    """``"gpqa"``, ``"mmlu"`` or ``"short"``; InvalidInstance naming what is missing."""
    gpqa = [name for name in GPQA_FIELDS if name in instance]
    if gpqa and "question" in instance:
        raise InvalidInstance("instance", "give 'question' (MMLU or short answer) or GPQA's 'Question', not both")
    if gpqa:
        return "gpqa"
    if "question" not in instance:
        raise InvalidInstance("instance.question", "required (or GPQA's 'Question' and answers)")
    if "choices" in instance:
        return "mmlu"
    return "short"


def _text(instance: Mapping[str, Any], name: str, field: str | None = None) -> str:
    field = field or f"instance.{name}"
    if name not in instance:
        raise InvalidInstance(field, "required")
    value = instance[name]
    if not isinstance(value, str) or not value.strip():
        raise InvalidInstance(field, "must be a non-empty string")
    return value.strip()


def _optional_text(instance: Mapping[str, Any], name: str, field: str | None = None) -> str | None:
    return _text(instance, name, field) if instance.get(name) is not None else None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _mmlu(instance: Mapping[str, Any]) -> tuple[list[str], int]:
    choices = instance["choices"]
    if not isinstance(choices, list) or not 2 <= len(choices) <= len(LETTERS):
        raise InvalidInstance("instance.choices", f"must be a list of 2 to {len(LETTERS)} strings")
    texts = [_text({"c": c}, "c", f"instance.choices[{i}]") for i, c in enumerate(choices)]
    if "answer" not in instance:
        raise InvalidInstance("instance.answer", "required: the correct choice, a 0-based index or a letter")
    answer, letters = instance["answer"], LETTERS[: len(texts)]
    if _is_int(answer) and 0 <= answer < len(texts):
        return texts, answer
    letter = answer.strip().upper() if isinstance(answer, str) else None
    if letter and len(letter) == 1 and letter in letters:
        return texts, letters.index(letter)
    raise InvalidInstance(
        "instance.answer", f"must be an index 0..{len(texts) - 1} or a letter {letters[0]}..{letters[-1]}"
    )


def gpqa_order(question: str, answers: list[str], seed: int | None = None) -> list[int]:
    """The shuffled order of GPQA's answers (indices into ``answers``), fixed by the
    seed or else the question text: hash-sorted, so it never depends on Python's RNG."""
    material = question if seed is None else f"seed:{seed}"

    def key(index: int) -> bytes:
        return hashlib.sha256(f"{material}\x00{index}\x00{answers[index]}".encode()).digest()

    return sorted(range(len(answers)), key=key)


def _gpqa(instance: Mapping[str, Any]) -> tuple[list[str], int]:
    for name in GPQA_FIELDS:
        _text(instance, name, f'instance["{name}"]')
    seed = instance.get("shuffle_seed")
    if seed is not None and not _is_int(seed):
        raise InvalidInstance("instance.shuffle_seed", "must be an integer")
    answers = [instance[name].strip() for name in ("Correct Answer", *GPQA_INCORRECT)]
    order = gpqa_order(instance["Question"].strip(), answers, seed)
    return [answers[i] for i in order], order.index(0)


def _short(instance: Mapping[str, Any]) -> dict[str, Any]:
    if "answer" not in instance:
        raise InvalidInstance("instance.answer", "required: the gold answer (a string or a number)")
    answer = instance["answer"]
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)) or not str(answer).strip():
        raise InvalidInstance("instance.answer", "must be a non-empty string or a number")
    numeric = not isinstance(answer, str) or is_numeric_answer(answer)
    kind = instance.get("answer_type")
    if kind is None:
        kind = "number" if numeric else "exact"
    elif kind not in ANSWER_TYPES:
        raise InvalidInstance("instance.answer_type", f"must be one of {', '.join(ANSWER_TYPES)}")
    elif kind == "number" and not numeric:
        raise InvalidInstance("instance.answer", "answer_type 'number' needs a number (a unit after it is fine)")
    spec: dict[str, Any] = {"kind": kind, "gold": str(answer).strip()}
    tolerance = instance.get("tolerance")
    if tolerance is not None:
        if kind != "number":
            raise InvalidInstance("instance.tolerance", "only for answer_type 'number'")
        if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not 0 <= tolerance < 1:
            raise InvalidInstance("instance.tolerance", "must be a number in [0, 1) (relative)")
    if kind == "number":
        spec["tolerance"] = float(DEFAULT_TOLERANCE if tolerance is None else tolerance)
    return spec


def prepare(instance: Mapping[str, Any]) -> StemQuestion:
    """Validate ``instance`` and build what an episode needs: the prompt text, the
    answer spec (see ``stem.answers``), and details for the evaluation."""
    if not isinstance(instance, dict):
        raise InvalidInstance("instance", "must be an object")
    shape = instance_shape(instance)
    for name in ("instructions", "system_prompt", "subject", "Subdomain", "High-level domain"):
        _optional_text(instance, name, f'instance["{name}"]' if " " in name else None)
    if shape == "short":
        question = _text(instance, "question")
        spec = _short(instance)
        subject = instance.get("subject")
    else:
        if shape == "mmlu":
            question = _text(instance, "question")
            choices, gold = _mmlu(instance)
            subject = instance.get("subject")
        else:
            choices, gold = _gpqa(instance)
            question = instance["Question"].strip()
            subject = instance.get("Subdomain") or instance.get("High-level domain")
        for name in ("answer_type", "tolerance"):
            if name in instance:
                raise InvalidInstance(f"instance.{name}", "only for short-answer instances")
        spec = {"kind": "choice", "choices": choices, "gold": LETTERS[gold]}
        question += "\n\n" + "\n".join(f"{LETTERS[i]}) {text}" for i, text in enumerate(choices))
    if subject:
        question = f"Subject: {subject.strip()}\n\n{question}"
    if spec["kind"] == "choice":
        default_format = choice_format(LETTERS[: len(spec["choices"])])
    else:
        default_format = value_format(spec["kind"])
    return StemQuestion(
        question=question,
        spec=spec,
        shape=shape,
        subject=subject.strip() if subject else None,
        answer_format=instance.get("instructions") or default_format,
        system_prompt=instance.get("system_prompt") or SYSTEM_PROMPT,
    )


# --- the handler ---------------------------------------------------------------------
class StemHandler(AgentHandler):
    """Multiple-choice and short-answer science questions, exact reward."""

    name = "stem"
    defaults = ANSWER_DEFAULTS  # the same shape of episode as math's: answer, maybe a retry

    def judge_task(self, instance: Mapping[str, Any]) -> str | None:
        return prepare(instance).question

    def validate(self, instance: Mapping[str, Any]) -> None:
        prepare(instance)

    def rescore_problem(self, instance: Mapping[str, Any]) -> str | None:
        return None  # EVAL reads the final answer from the messages alone

    async def init(self, rollout: RolloutView) -> None:
        """Validate again (a replay may skip the API's check) and keep the prompt and
        the answer spec (``StemQuestion``)."""
        rollout.state = prepare(rollout.instance)

    async def run(self, rollout: RolloutView) -> None:
        state = self.state(rollout, StemQuestion)
        env = StemEnv(state.question, state.system_prompt, state.spec, state.answer_format)
        await run_episode(self.ctx, rollout, env)

    async def eval(self, rollout: RolloutView) -> Evaluation:
        """The outcome reward, with its components: ``correctness`` (the reward) and
        ``format`` (1.0 when one answer could be read in the asked format)."""
        return with_answer_components(await self._eval(rollout))

    async def _eval(self, rollout: RolloutView) -> Evaluation:
        state = self.state(rollout, StemQuestion)
        spec = state.spec
        reading = final_answer(rollout.trajectory.messages, lambda text: read_answer(text, spec))
        answer = reading.answer if reading else None
        kind = spec["kind"]
        details: dict[str, Any] = {
            "extracted": answer,
            "gold": spec["gold"],
            "method": "math-verify" if kind == "expression" else kind,
            "shape": state.shape,
            "turns": len(rollout.trajectory.turns),
        }
        if kind == "choice":
            choices = spec["choices"]
            details["gold_text"] = choices[LETTERS.index(spec["gold"])]
            details["extracted_text"] = choices[LETTERS.index(answer)] if answer else None
        if kind == "number":
            details["tolerance"] = spec["tolerance"]
        if state.subject:
            details["subject"] = state.subject
        if reading is not None and reading.ambiguous:  # a hedge: never scored
            details["ambiguous"] = True
            details["named"] = list(reading.named)
        if answer is None:
            return Evaluation(reward=0.0, details=details)
        try:
            correct = await score_in_pool(self.ctx.scoring, score_stem_answer, answer, spec, what="stem scorer")
        except ScoringTimeout:  # a pathological expression: the agent's doing
            details["timeout"] = True
            return Evaluation(reward=0.0, details=details)
        return Evaluation(reward=1.0 if correct else 0.0, details=details)

    async def cleanup(self, rollout: RolloutView) -> None:
        """Nothing to release: no sandbox, and the scoring pool is shared."""
