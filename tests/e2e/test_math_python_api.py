"""math with the python tool through the HTTP API: the scripted policy computes in
IPython inside a bubblewrap sandbox, then calls finish."""

from __future__ import annotations

import pytest

from rollserve.agent.tool_calls import format_tool_call
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from rollserve.testing import FakeVLLM

pytestmark = pytest.mark.skipif(
    BubblewrapRuntime.unavailable_reason() is not None,
    reason=f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}",
)


def policy(prompt_ids: list[int], prompt: str) -> str:
    if "<tool_response>" not in prompt:
        return format_tool_call("python", {"code": "import sympy\nprint(sympy.fibonacci(20))"})
    answer = "6765" if "\n6765\n" in prompt else "unknown"
    return "So it is 6765.\n" + format_tool_call("finish", {"answer": answer})


async def test_math_python_through_the_api(make_api, ipython_in_bubblewrap):
    async with FakeVLLM("smollm2", replies=policy, latency=0.01) as server:
        _, client = await make_api([server.url])
        body = {
            "tasks": [
                {"data_source": "math_python", "instance": {"question": "What is F(20)?", "answer": "6765"}},
                {
                    "data_source": "math",
                    "instance": {"question": "What is F(20)?", "answer": "6765", "tools": ["python"]},
                    "agent": {"max_turns": 4},
                },
            ]
        }
        r = await client.post("/v1/rollouts", json=body)
        assert r.status_code == 202, r.text
        for group in r.json()["groups"]:
            (rid,) = group["rollout_ids"]
            result = (await client.get(f"/v1/rollouts/{rid}", params={"wait": 60})).json()["result"]
            assert result["status"] == "completed" and not result["mask"], result["failure"]
            assert result["reward"] == 1.0 and result["evaluation"]["tools"] == ["python"]
            assert result["stats"]["tool_calls"] == 2 and result["trajectory"]["ended_by"] == "finished"
        r = await client.post(
            "/v1/rollouts",
            json={"tasks": [{"data_source": "math", "instance": {"question": "q", "answer": "1", "tools": ["bash"]}}]},
        )
        assert r.status_code == 422 and r.json()["errors"][0]["field"] == "tasks[0].instance.tools[0]"
        status = (await client.get("/v1/status")).json()["sandboxes"]
        assert status["open"] == 0 and status["started"] == 2
