"""What the swe API tests share: a scripted policy's replies, and a service factory
whose swe handler's mirrors hold the toy repository."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from rollserve.agent.tool_calls import format_tool_call
from rollserve.testing import FakeVLLM

TAG = re.compile(r"\[policy:([\w.-]+)\]")


def scripted(steps_of: Callable[[str], list[str]]) -> Callable[[list[int], str], str]:
    """A FakeVLLM ``replies``: the prompt's ``[policy:MODE]`` tag picks the steps
    ``steps_of(MODE)``, one a turn; past them the policy finishes."""

    def policy(prompt_ids: list[int], prompt: str) -> str:
        steps = steps_of(TAG.search(prompt).group(1))
        turn = prompt.count("<|im_start|>assistant") - 1
        return steps[turn] if turn < len(steps) else "Done.\n" + format_tool_call("finish", {})

    return policy


def swe_service(make_api, llm_url: str, tmp_path: Path, mirrors: str, **defaults):
    """``make(**options)``: a service (make_api's) whose swe handler has ``defaults``
    overridden by ``options``, its mirrors in ``tmp_path / mirrors`` and its repository
    cache in ``tmp_path / "cache"``."""

    async def make(**options):
        return await make_api(
            [llm_url],
            server={
                "handler_options": {
                    "swe": {
                        "mirrors": [str(tmp_path / mirrors)],
                        "repo_cache": str(tmp_path / "cache"),
                        **defaults,
                        **options,
                    }
                }
            },
        )

    return make


def llm_fixture(policy: Callable[[list[int], str], str]):
    """An ``llm`` fixture: the vLLM double answering with ``policy``."""

    @pytest.fixture
    async def llm():
        async with FakeVLLM("smollm2", replies=policy, latency=0.0) as server:
            yield server

    return llm
