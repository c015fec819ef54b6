"""Episodes that end with one answer in a reply, without tools (math, stem): the
question, then a reminder of the format for each reply that gives no answer."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

from rollserve.agent.base import AgentEnv, Message, Step
from rollserve.handlers.base import Evaluation, HandlerDefaults

AnswerT = TypeVar("AnswerT")  # what a family reads as an answer (math: the boxed text)

# The shape of such an episode: an answer, maybe a retry or two.
ANSWER_DEFAULTS = HandlerDefaults(
    max_turns=3,
    max_context_tokens=2048,
    init_timeout=30.0,
    run_timeout=300.0,
    eval_timeout=30.0,
    total_timeout=600.0,
)


class AnswerEnv(AgentEnv, Generic[AnswerT]):
    """One question; the episode ends at the first reply in which ``extract`` finds
    an answer, and every reply without one is told ``retry_message``."""

    def __init__(self, question: str, system_prompt: str, answer_format: str, retry_message: str) -> None:
        self.question = question
        self.system_prompt = system_prompt
        self.answer_format = answer_format  # closes the question message
        self.retry_message = retry_message
        self.answer: AnswerT | None = None
        self.malformed_replies = 0

    def initial_messages(self) -> list[Message]:
        return [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": f"{self.question}\n\n{self.answer_format}"},
        ]

    @abstractmethod
    def extract(self, reply: str) -> AnswerT | None:
        """The final answer in ``reply``, or None when it gives none."""

    async def step(self, reply: str) -> Step:
        answer = self.extract(reply)
        if answer is not None:
            self.answer = answer
            return Step(done=True, reason="finished")
        self.malformed_replies += 1
        return Step(messages=[{"role": "user", "content": self.retry_message}])


def final_answer(messages: Sequence[Mapping[str, Any]], extract: Callable[[str], AnswerT | None]) -> AnswerT | None:
    """The answer ``extract`` finds in the last assistant message that has one."""
    for message in reversed(messages):
        if message.get("role") == "assistant":
            answer = extract(message.get("content") or "")
            if answer is not None:
                return answer
    return None


def with_answer_components(evaluation: Evaluation) -> Evaluation:
    """``evaluation`` with the components of a single-answer family (the result's
    ``reward_components``): ``correctness`` (the reward) and ``format`` (1.0 when one
    final answer could be read: ``details.extracted`` set, not ``ambiguous``)."""
    details = evaluation.details
    read = details.get("extracted") is not None and not details.get("ambiguous")
    evaluation.components = {"correctness": evaluation.reward, "format": 1.0 if read else 0.0}
    return evaluation
