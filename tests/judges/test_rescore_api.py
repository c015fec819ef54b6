"""Re-scoring through the HTTP API (``POST /v1/results/rescore``): a stored batch
judged by a first rubric, re-scored by a second, gets the second rubric's rewards as
new results beside the old ones (new ids, in the results cursor, ``rescored_from`` and
``scoring`` set, in a group of their own), leaves the first results as they were, and
samples nothing. A family whose EVAL needs its run is refused naming the family; an id
the store does not hold is a 404."""

from __future__ import annotations

import pytest

from rollserve.testing import FakeVLLM
from tests.judges.judge_doubles import TAG, math_task, results, submit


def policy(prompt_ids, prompt: str) -> str:
    return {"right": "So \\boxed{7}", "wrong": "So \\boxed{9}"}[TAG.findall(prompt)[0]]


async def test_rescore_a_stored_batch_with_a_second_rubric(make_api, tok):
    async with (
        FakeVLLM(tok, replies=policy) as pol,
        FakeVLLM(tok, replies="Fine.\nSCORE: 8") as first,
        FakeVLLM(tok, replies="Strict.\nSCORE: 2") as second,
    ):
        service, client = await make_api(
            [pol.url],
            server={
                "judges": [f"first={first.url}", f"second={second.url}"],
                "rubrics": {"one": {"judges": ["first"], "weight": 0.5}, "two": {"judges": ["second"], "weight": 0.5}},
            },
        )
        judge = {"rubric": "one"}
        ids = await submit(client, [math_task("right", judge), math_task("wrong", judge), math_task("right", judge)])
        old = await results(client, ids)
        assert [r["reward"] for r in old] == [pytest.approx(0.9), pytest.approx(0.4), pytest.approx(0.9)]
        sampled = len(pol.calls)
        last = (await client.get("/v1/results", params={"after": 0})).json()["next"]

        r = await client.post("/v1/results/rescore", json={"result_ids": ids, "judge": {"rubric": "two"}})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["scoring"] == "judge:two"
        new = body["results"]
        assert [n["rescored_from"] for n in new] == ids
        assert not {n["id"] for n in new} & set(ids)
        assert [n["reward"] for n in new] == [pytest.approx(0.6), pytest.approx(0.1), pytest.approx(0.6)]
        assert len(pol.calls) == sampled  # nothing sampled
        assert len(second.calls) == 3

        # beside the old ones, through the results cursor
        page = (await client.get("/v1/results", params={"after": last})).json()
        got = {res["id"]: res for res in page["results"]}
        assert set(got) == {n["id"] for n in new}
        for n, old_result in zip(new, old, strict=True):
            res = got[n["id"]]
            assert res["rescored_from"] == old_result["id"] and res["scoring"] == "judge:two"
            assert res["trajectory"] == old_result["trajectory"]
            assert res["reward_components"]["judge"] == pytest.approx(0.2)
            assert res["evaluation"]["judge"]["rubric"] == "two"
        # the first results are intact
        again = await results(client, ids)
        assert [(a["reward"], a["evaluation"]) for a in again] == [(o["reward"], o["evaluation"]) for o in old]
        assert all(a["scoring"] is None and a["rescored_from"] is None for a in again)
        # the group view says which scoring each result had
        group = (await client.get(f"/v1/groups/{new[0]['group_id']}")).json()
        assert {m["result"]["scoring"] for m in group["rollouts"]} == {"judge:two"}

        # the family's own grader alone (no judge): the outcome
        r = await client.post("/v1/results/rescore", json={"result_ids": ids[:2]})
        assert r.status_code == 200, r.text
        assert r.json()["scoring"] == "outcome"
        assert [n["reward"] for n in r.json()["results"]] == [1.0, 0.0]

        # refusals: beyond the store, a family whose EVAL needs its run, a bad rubric
        r = await client.post("/v1/results/rescore", json={"result_ids": ["nope-0"]})
        assert r.status_code == 404 and "result_ids[0]" in r.text
        r = await client.post("/v1/results/rescore", json={"result_ids": ids, "judge": {"rubric": "three"}})
        assert r.status_code == 422 and "judge.rubric" in r.text
        assert len(pol.calls) == sampled
        # families whose EVAL needs what only their run had say so, naming themselves
        for family, instance in (
            ("gateway", {"answer": "hi"}),
            ("code", {"prompt": "p", "tests": []}),
            ("math", {"question": "q", "answer": "1", "tools": ["python"]}),
        ):
            problem = service.engine.handler(family).rescore_problem(instance)
            assert problem is not None and family in problem, (family, problem)
        assert service.engine.handler("stem").rescore_problem({}) is None
        # swe scores its stored patch again (tests/e2e/test_swe_rescore_api.py), not a
        # result whose EVAL never ended
        swe = service.engine.handler("swe")
        assert swe.rescore_problem({}) is None
        assert "no evaluation" in swe.rescore_result_problem(None)


async def test_only_a_completed_result_is_scored_again(make_api, tok):
    """A result its EVAL never scored (cancelled here; an agent failure's 0 or an
    infrastructure failure's mask alike) stands as it is: a 422 naming it, nothing
    written, nothing sampled."""
    async with FakeVLLM(tok, replies=policy, latency=600.0) as pol:
        service, client = await make_api([pol.url])
        (rid,) = await submit(client, [math_task("right")])
        r = await client.delete(f"/v1/rollouts/{rid}")  # its call to the policy takes 10 min
        assert r.status_code == 200, r.text
        (done,) = await results(client, [rid])
        assert done["status"] == "cancelled"
        last = (await client.get("/v1/results", params={"after": 0})).json()["next"]
        r = await client.post("/v1/results/rescore", json={"result_ids": [rid]})
        assert r.status_code == 422 and "result_ids[0]" in r.text and "cancelled" in r.text
        page = (await client.get("/v1/results", params={"after": last})).json()
        assert page["results"] == []


def most_at_once(calls) -> int:
    """The most of ``calls`` in flight together (from their recorded start and end)."""
    edges = sorted([(c.received_at, 1) for c in calls] + [(c.finished_at, -1) for c in calls])
    peak = now = 0
    for _, step in edges:
        now += step
        peak = max(peak, now)
    return peak


async def test_rescores_take_the_engines_init_and_eval_slots(make_api, tok):
    """Re-scores run through the engine's stage pools: with --eval-workers 1, a batch of
    re-scores whose judge takes a while has one judge call in flight at a time (each
    re-score's EVAL holds the pool's one slot), and the INIT and EVAL pools count them."""
    async with FakeVLLM(tok, replies=policy) as pol, FakeVLLM(tok, replies="Fine.\nSCORE: 8", latency=0.3) as judge:
        _, client = await make_api(
            [pol.url],
            eval_workers=1,
            server={"judges": [f'{{"name": "j", "backend": "{judge.url}", "concurrency": 8}}']},
        )
        ids = await submit(client, [math_task("right"), math_task("wrong"), math_task("right"), math_task("wrong")])
        await results(client, ids)
        before = (await client.get("/v1/status")).json()["stages"]
        r = await client.post("/v1/results/rescore", json={"result_ids": ids, "judge": {"rubric": "default"}})
        assert r.status_code == 200, r.text
        after = (await client.get("/v1/status")).json()["stages"]
    assert [n["reward"] for n in r.json()["results"]] == [pytest.approx(0.8)] * 4
    assert len(judge.calls) == 4 and most_at_once(judge.calls) == 1
    assert after["eval"]["done"] - before["eval"]["done"] == 4
    assert after["init"]["done"] - before["init"]["done"] == 4
