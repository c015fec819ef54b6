r"""Scripted policies for the fake inference servers, written as a Python file.

``rollserve fake-llm --script policy.py`` (and ``python -m rollserve.testing.fake_vllm
--script policy.py``) load ``policy.py`` and answer every generation request with its
``reply`` function, the same callable ``FakeVLLM(replies=...)`` takes in Python::

    # policy.py: a per-rollout, multi-turn policy
    from rollserve.testing.scripted_policy import chat_turns

    def reply(prompt_ids: list[int], prompt: str) -> str:
        messages = chat_turns(prompt)         # the conversation so far
        task = messages[1]["content"] if len(messages) > 1 else ""   # after the system prompt
        turn = sum(m["role"] == "assistant" for m in messages)   # replies so far
        if "capital" in task:
            return "Paris" if turn == 0 else "Still Paris."
        return "The answer is \\boxed{4}."

``reply`` may be ``async``. It sees the whole prompt of the call (rendered with the
chat template), so a policy keys its behaviour on the task (which rollout) and on the
number of assistant turns so far (which turn); nothing is shared between calls unless
the file keeps it in a global.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
import sys
from pathlib import Path

from rollserve.testing.fake_server import ReplyFn

__all__ = ["ScriptError", "chat_turns", "load_reply_script"]

_CHATML = re.compile(r"<\|im_start\|>(\w+)\n(.*?)(?:<\|im_end\|>|\Z)", re.S)


class ScriptError(ValueError):
    """The policy file cannot be used (names the file and why)."""


def load_reply_script(path: str | Path) -> ReplyFn:
    """The ``reply(prompt_ids, prompt)`` function of the Python file at ``path``."""
    path = Path(path)
    if not path.is_file():
        raise ScriptError(f"{path}: no such file")
    spec = importlib.util.spec_from_file_location(f"rollserve_policy_{abs(hash(path))}", path)
    if spec is None or spec.loader is None:
        raise ScriptError(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and pickling look modules up by name
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        sys.modules.pop(spec.name, None)
        raise ScriptError(f"{path}: failed to load: {type(error).__name__}: {error}") from error
    reply = getattr(module, "reply", None)
    if not callable(reply):
        raise ScriptError(f"{path}: defines no function 'reply(prompt_ids, prompt)'")
    try:
        inspect.signature(reply).bind([], "")
    except TypeError as error:
        raise ScriptError(f"{path}: reply must take (prompt_ids, prompt): {error}") from error
    return reply


def chat_turns(prompt: str) -> list[dict[str, str]]:
    """The messages of a ChatML prompt (SmolLM2's and Qwen's template), in order, with
    the open assistant turn at the end left out."""
    messages = [{"role": role, "content": content} for role, content in _CHATML.findall(prompt)]
    if messages and messages[-1]["role"] == "assistant" and not messages[-1]["content"].strip():
        messages.pop()
    return messages
