"""Policies that dodge their zero by turning their own failure into a masked
infrastructure failure, through the HTTP API with the scripted vLLM double and real
bubblewrap sandboxes. Each got a masked result (never trained on) before rollserve
closed it; now each is scored 0:

- stalling: a tool that sleeps until the RUN deadline (the episode now ends itself
  before it, ``time_limit``, and EVAL scores it), while a slow LLM backend is still
  masked;
- context overflow: replies long enough to outgrow the backend's context window (the
  window now clamps the episode, ``context_exhausted``, and a backend's own 400 for a
  prompt too long ends it the same way).
"""

from __future__ import annotations

import time

import pytest

from rollserve.agent.tool_calls import format_tool_call
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from rollserve.testing import FakeVLLM
from tests.e2e.test_code_api import bwraps, result_of, sleepers, submit, task

pytestmark = pytest.mark.skipif(
    BubblewrapRuntime.unavailable_reason() is not None,
    reason=f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}",
)

WINDOW = 2048  # the backend's max_model_len in the overflow tests
FILLER = " ".join(f"word{i}" for i in range(400))  # far more than one turn's max_tokens


def policy(prompt_ids: list[int], prompt: str) -> str:
    """By the task's tag: sleep in the shell, talk at length, or check something."""
    if "[sleeper]" in prompt:
        return format_tool_call("bash", {"command": "sleep 987.65"})
    if "[verbose]" in prompt:  # a call first, then talk until max_tokens cuts it
        return format_tool_call("bash", {"command": "echo still working"}) + "\n" + FILLER
    return format_tool_call("bash", {"command": "echo checking"})


@pytest.fixture
async def llm():
    async with FakeVLLM("smollm2", replies=policy, latency=0.01) as server:
        yield server


async def test_a_policy_that_stalls_until_the_deadline_is_scored_zero(make_api, llm):
    _, client = await make_api([llm.url])
    started = time.monotonic()
    (rid,) = await submit(client, task("sleeper"), timeouts={"run": 10.0})
    result = await result_of(client, rid)
    assert result["status"] == "completed", result["failure"]
    assert result["mask"] is False and result["reward"] == 0.0
    assert result["trajectory"]["ended_by"] == "time_limit"
    assert result["evaluation"]["submitted"] is False  # EVAL ran: scored, not masked
    [turn] = result["trajectory"]["turns"]
    assert turn["tool_calls"] == [{"name": "bash", "arguments": {"command": "sleep 987.65"}, "id": None}]
    # Ended at the time limit (the RUN deadline less the margin), not at the deadline.
    assert result["timing"]["run"] < 10.0
    assert result["timing"]["tools"] > result["timing"]["llm"]
    assert time.monotonic() - started < 60
    assert sleepers() == [] and bwraps() == []  # the sleep was stopped, the sandbox closed


async def test_a_slow_backend_is_still_masked(make_api):
    async with FakeVLLM("smollm2", replies=policy, latency=3.0) as slow:
        _, client = await make_api([slow.url])
        (rid,) = await submit(client, task("checker"), timeouts={"run": 10.0})
        result = await result_of(client, rid)
    assert result["status"] == "timed_out" and result["mask"] is True
    assert result["reward"] is None and result["evaluation"] is None
    failure = result["failure"]
    assert failure["stage"] == "run" and failure["kind"] == "timeout"
    assert "waiting on the LLM backend" in failure["message"]
    assert result["timing"]["llm"] > result["timing"]["tools"]


@pytest.mark.parametrize("reported", [True, False], ids=["window-read", "window-refused"])
async def test_replies_that_outgrow_the_context_window_are_scored_zero(make_api, reported):
    async with FakeVLLM(
        "smollm2", replies=policy, latency=0.01, max_model_len=WINDOW, report_max_model_len=reported
    ) as llm:
        _, client = await make_api([llm.url])
        # The rollout's own limit is far above the backend's window.
        (rid,) = await submit(client, task("verbose"), agent={"max_context_tokens": 8192})
        result = await result_of(client, rid)
        calls = list(llm.calls)
    assert result["status"] == "completed", result["failure"]
    assert result["mask"] is False and result["reward"] == 0.0
    trajectory = result["trajectory"]
    assert trajectory["ended_by"] == "context_exhausted"
    assert len(trajectory["turns"]) >= 2
    assert len(trajectory["tokens"]["input_ids"]) <= WINDOW
    sent = [c for c in calls if c.route == "/v1/completions"]
    if reported:  # the window was read from /v1/models: nothing too long was ever sent
        assert all(c.status != 400 for c in sent)
        assert all(len(c.prompt_ids) + c.request["max_tokens"] <= WINDOW for c in sent)
    else:  # the server's own refusal ended the episode, typed as the agent's
        assert [c.status for c in sent].count(400) == 1 and sent[-1].status == 400
