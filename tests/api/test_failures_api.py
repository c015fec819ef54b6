"""Infrastructure failures come back typed and masked; cancels stop LLM calls in flight."""

import time

from tests.waiting import eventually

MATH = {"data_source": "math", "instance": {"question": "What is 2 + 2?", "answer": "4"}}


async def _one(client, body):
    r = await client.post("/v1/rollouts", json=body)
    assert r.status_code == 202, r.text
    return r.json()["groups"][0]["rollout_ids"][0]


async def test_a_broken_inference_server_is_an_infra_failure_not_a_wrong_answer(make_api, fake_llm):
    _, client = await make_api([fake_llm.url])
    fake_llm.fail_next(10, mode="error", status=500)
    rid = await _one(client, {"tasks": [MATH]})
    view = (await client.get(f"/v1/rollouts/{rid}", params={"wait": 30})).json()
    result = view["result"]
    assert result["status"] == "failed" and result["reward"] is None
    assert result["mask"] is True
    assert result["failure"]["stage"] == "run" and result["failure"]["kind"] == "infra"
    assert "500" in result["failure"]["message"]


async def test_cancel_aborts_a_hanging_llm_call(make_api, fake_llm):
    _, client = await make_api([fake_llm.url])
    fake_llm.fail_next(1, mode="hang")
    rid = await _one(client, {"tasks": [MATH]})
    await eventually(lambda: fake_llm.calls, what="the LLM call that hangs")
    started = time.perf_counter()
    r = await client.delete(f"/v1/rollouts/{rid}")
    assert r.json()["status"] == "cancelled"
    assert time.perf_counter() - started < 8.0  # the hung call is abandoned at once
    status = (await client.get("/v1/status")).json()
    assert status["in_flight"] == 0 and status["stages"]["run"]["busy"] == 0
    assert all(b["outstanding"] == 0 for b in status["backends"])


async def test_a_hanging_llm_call_ends_at_the_run_timeout(make_api, fake_llm):
    _, client = await make_api([fake_llm.url])
    fake_llm.fail_next(1, mode="hang")
    rid = await _one(client, {"tasks": [MATH], "timeouts": {"run": 0.5}})
    result = (await client.get(f"/v1/rollouts/{rid}", params={"wait": 10})).json()["result"]
    assert result["status"] == "timed_out" and result["failure"]["stage"] == "run"
    assert result["mask"] is True
