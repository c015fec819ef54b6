"""What a STEM agent reads: the system prompt, and how to give the answer (a letter,
or a value), first in the question and again after a reply without one."""

from __future__ import annotations

from typing import Any

from rollserve.handlers.stem.answers import LETTERS

SYSTEM_PROMPT = (
    "You are a careful science assistant. Think the question through step by step, "
    "then give your final answer in the format you are asked for."
)


def choice_format(letters: str) -> str:
    return (
        f'Think step by step, then end your reply with a line of the form "Answer: X", '
        f"where X is the letter of the correct choice ({', '.join(letters)})."
    )


def value_format(kind: str) -> str:
    what = {
        "number": "the number (a unit after it is fine)",
        "exact": "the answer in a few words",
        "expression": "the expression",
    }[kind]
    return (
        f'Think step by step, then end your reply with a line of the form "Answer: <value>", '
        f"giving {what} and nothing else."
    )


def retry_message(spec: dict[str, Any]) -> str:
    if spec["kind"] == "choice":
        wanted = f'"Answer: X", where X is one of {", ".join(LETTERS[: len(spec["choices"])])}'
    else:
        wanted = '"Answer: <value>"'
    return f"I could not find a final answer in your reply. Please end your reply with a line {wanted}."
