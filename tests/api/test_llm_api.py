"""The inference layer through the HTTP API: a weight update mid-batch (pause, new
weights, resume) and a backend killed mid-batch; drain and the backend listing."""

import asyncio
import re

import pytest

from rollserve.testing import FakeVLLM
from tests.waiting import eventually

QUESTIONS = [("What is 2 + 2?", "4"), ("What is 3 + 5?", "8"), ("What is 1 + 6?", "7"), ("What is 9 - 4?", "5")]


def tasks(n: int = 4) -> list[dict]:
    return [{"data_source": "math", "n": n, "instance": {"question": q, "answer": a}} for q, a in QUESTIONS]


def three_turn_replies(weights: dict):
    """Two replies without an answer, then the boxed answer; each names the weights."""

    def reply(prompt_ids, prompt_text):
        turn = prompt_text.count("<|im_start|>assistant") - 1  # the generation prompt is one
        version = weights["version"]
        if turn < 2:
            return f"[v{version}] Let me think about turn {turn}."
        answer = re.findall(r"What is (\d+) ([+-]) (\d+)", prompt_text)[0]
        value = int(answer[0]) + int(answer[2]) * (1 if answer[1] == "+" else -1)
        return f"[v{version}] So it is \\boxed{{{value}}}."

    return reply


async def submit(client, **extra) -> list[str]:
    body = {"tasks": tasks(), "sampling": {"max_tokens": 48}, "agent": {"max_turns": 3}, **extra}
    r = await client.post("/v1/rollouts", json=body)
    assert r.status_code == 202, r.text
    return [rid for g in r.json()["groups"] for rid in g["rollout_ids"]]


async def results_of(client, ids: list[str], wait: float = 30) -> list[dict]:
    views = await asyncio.gather(*[client.get(f"/v1/rollouts/{rid}", params={"wait": wait}) for rid in ids])
    out = [v.json()["result"] for v in views]
    assert all(r is not None for r in out), "a rollout is still running: hung"
    return out


@pytest.mark.parametrize("mode", ["finish", "abort"])
async def test_pause_update_weights_resume_mid_batch(make_api, tok, mode):
    weights = {"version": 1}
    async with FakeVLLM(tok, replies=three_turn_replies(weights), latency=0.15) as fake:
        service, client = await make_api([fake.url])
        assert (await client.post("/v1/llm/resume", json={"policy_version": 1})).json() == {
            "paused": False,
            "policy_version": 1,
            "forwarded": {},
        }
        ids = await submit(client)
        # mid-batch: every rollout started, most on turn 2
        await eventually(lambda: len(fake.calls) >= 20, what="20 LLM calls")
        r = await client.post("/v1/llm/pause", json={"mode": mode})
        report = r.json()
        assert r.status_code == 200 and report["paused"] and report["drained"]
        assert report["in_flight"] == 0 and report["mode"] == mode
        if mode == "abort":
            assert report["aborted"] > 0
        served = len(fake.calls)
        # sleep-ok below: a window in which nothing may happen; it cannot make the check pass
        await asyncio.sleep(0.3)  # sleep-ok: observation window for calls sent while paused
        late = fake.calls[served:]  # nothing new is sent while paused; in abort mode a
        # request aborted on its way may still reach the server (its answer is dropped)
        assert not late if mode == "finish" else len(late) <= report["aborted"]
        listing = (await client.get("/v1/llm/backends")).json()
        assert listing["router"]["paused"] is True and listing["backends"][0]["outstanding"] == 0
        weights["version"] = 2  # "update the weights"
        r = await client.post("/v1/llm/resume", json={"policy_version": 2})
        assert r.json()["policy_version"] == 2
        results = await results_of(client, ids)
    assert len(results) == 16 and all(r["status"] == "completed" for r in results)
    seen = set()
    for result in results:
        trajectory = result["trajectory"]
        assert len(trajectory["turns"]) == 3 and result["reward"] == 1.0
        for turn in trajectory["turns"]:
            sampled_by = int(re.match(r"\[v(\d)\]", tok.decode(turn["output_ids"])).group(1))
            assert turn["policy_version"] == sampled_by  # the version that produced the turn
            seen.add(sampled_by)
        assert trajectory["policy_versions"] == sorted({t["policy_version"] for t in trajectory["turns"]})
        assert result["stale"] is False  # no max_staleness set
    assert seen == {1, 2}  # the update really happened mid-batch
    status = (await client.get("/v1/status")).json()
    assert status["trajectories"]["fidelity_mismatches"] == 0


async def test_stale_rollouts_are_flagged_and_masked_by_setting(make_api, tok):
    weights = {"version": 1}
    async with FakeVLLM(tok, replies=three_turn_replies(weights), latency=0.1) as fake:
        _, client = await make_api([fake.url], max_staleness=0, mask_stale=True)
        await client.post("/v1/llm/resume", json={"policy_version": 1})
        ids = await submit(client)
        await eventually(lambda: len(fake.calls) >= 20, what="20 LLM calls")
        await client.post("/v1/llm/pause", json={"mode": "finish"})
        weights["version"] = 2
        await client.post("/v1/llm/resume", json={"policy_version": 2})
        results = await results_of(client, ids)
    mixed = [r for r in results if r["trajectory"]["policy_versions"] == [1, 2]]
    assert mixed and all(r["stale"] and r["mask"] for r in mixed)
    assert all("stale" in r["mask_reason"] for r in mixed)
    clean = [r for r in results if len(r["trajectory"]["policy_versions"]) == 1]
    assert all(not r["stale"] and not r["mask"] and r["mask_reason"] is None for r in clean)
    status = (await client.get("/v1/status")).json()
    assert status["trajectories"]["stale"] == len(mixed)


async def test_killing_one_of_three_backends_mid_batch(make_api, tok):
    weights = {"version": 1}
    replies = three_turn_replies(weights)
    async with (
        FakeVLLM(tok, replies=replies, latency=0.1) as a,
        FakeVLLM(tok, replies=replies, latency=0.1) as b,
        FakeVLLM(tok, replies=replies, latency=0.1) as victim,
    ):
        service, client = await make_api([a.url, b.url, victim.url])
        ids = await submit(client, timeouts={"total": 20})
        await eventually(lambda: len(victim.calls) >= 6, what="6 calls on the victim")
        await victim.kill()  # mid-batch: calls in flight on it get no answer
        results = await results_of(client, ids)
        listing = (await client.get("/v1/llm/backends")).json()["backends"]
    assert len(results) == 16
    moved = 0
    for result in results:
        assert result["timing"]["total"] < 20  # none ran past its deadline
        if result["status"] == "completed":
            assert result["mask"] is False
            backends = [t["backend"] for t in result["trajectory"]["turns"]]
            moved += backends[0].endswith(f":{victim.port}") and len(set(backends)) > 1
        else:
            assert result["mask"] is True and result["mask_reason"]
    assert moved > 0  # trajectories that started on the dead backend finished elsewhere
    assert sum(r["status"] == "completed" for r in results) >= 14
    health = {b["url"]: b["healthy"] for b in listing}
    assert health[victim.url] is False and health[a.url] and health[b.url]


async def test_drain_and_list_backends(make_api, tok):
    async with (
        FakeVLLM(tok, replies="\\boxed{4}", latency=0.05) as one,
        FakeVLLM(tok, replies="\\boxed{4}", latency=0.05) as two,
    ):
        service, client = await make_api([one.url, two.url])
        name = next(b["name"] for b in (await client.get("/v1/llm/backends")).json()["backends"] if b["url"] == one.url)
        r = await client.post(f"/v1/llm/backends/{name}/drain", params={"wait": 5})
        assert r.status_code == 200 and r.json()["drained"] is True
        assert r.json()["backend"]["draining"] is True
        ids = await submit(client)
        results = await results_of(client, ids)
        assert all(r["status"] == "completed" for r in results)
        assert not one.calls and two.calls  # a drained backend takes nothing new
        listing = (await client.get("/v1/llm/backends")).json()
        mine = {b["url"]: b for b in listing["backends"]}
        assert set(mine[one.url]) >= {"healthy", "draining", "outstanding", "sessions", "weight"}
        text = (await client.get("/metrics")).text
        assert f'rollserve_llm_healthy{{backend="{name}"}} 0.0' in text  # draining
        assert "rollserve_llm_paused 0.0" in text and 'rollserve_llm_calls_total{kind="calls"}' in text
        assert (await client.get("/v1/status")).json()["llm"]["policy"] == "least_load"
        r = await client.post(f"/v1/llm/backends/{name}/undrain")
        assert r.json()["backend"]["draining"] is False
        assert (await client.post("/v1/llm/backends/nope/drain")).status_code == 404
        r = await client.post("/v1/llm/pause", json={"mode": "later"})
        assert r.status_code == 422 and r.json()["errors"][0]["field"] == "mode"
        r = await client.delete(f"/v1/llm/backends/{name}", params={"grace": 1})
        assert r.json() == {"removed": name}
