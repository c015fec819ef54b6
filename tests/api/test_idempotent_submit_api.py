"""A task's client ``id`` makes its submit idempotent, concurrent or not: every identical
submit answers 202 with the one group (the first admits it, the others are
``duplicate``), and only a different task under a taken id is a 409."""

import asyncio

MATH = {"data_source": "math", "instance": {"question": "What is 2 + 2?", "answer": "4"}}
SUBMITS = 20


async def _in_flight(client) -> int:
    return (await client.get("/v1/status")).json()["in_flight"]


async def test_concurrent_identical_submits_all_answer_the_one_group(make_api):
    _, client = await make_api()  # no backend: the rollouts stay queued, nothing finishes
    body = {"tasks": [{**MATH, "id": "task-42", "n": 2}]}
    answers = await asyncio.gather(*(client.post("/v1/rollouts", json=body) for _ in range(SUBMITS)))
    refused = [r.text for r in answers if r.status_code != 202]
    assert not refused, f"{len(refused)} of {SUBMITS} identical submits refused: {refused[0]}"
    groups = [r.json()["groups"][0] for r in answers]
    assert len({g["group_id"] for g in groups}) == 1
    assert sorted(g["duplicate"] for g in groups) == [False] + [True] * (SUBMITS - 1)
    assert all(g["rollout_ids"] == groups[0]["rollout_ids"] for g in groups)
    assert len(groups[0]["rollout_ids"]) == 2 and await _in_flight(client) == 2
    # ...and a resubmit later answers the same.
    again = (await client.post("/v1/rollouts", json=body)).json()["groups"][0]
    assert again["duplicate"] and again["group_id"] == groups[0]["group_id"]


async def test_concurrent_batches_sharing_one_id_admit_their_other_tasks(make_api):
    _, client = await make_api()
    shared = {**MATH, "id": "shared"}
    bodies = [{"tasks": [{**MATH, "id": f"own-{i}"}, shared]} for i in range(8)]
    answers = await asyncio.gather(*(client.post("/v1/rollouts", json=b) for b in bodies))
    assert [r.status_code for r in answers] == [202] * 8, [r.text for r in answers]
    own = [r.json()["groups"][0] for r in answers]
    shares = [r.json()["groups"][1] for r in answers]
    assert not any(g["duplicate"] for g in own) and len({g["group_id"] for g in own}) == 8
    assert len({g["group_id"] for g in shares}) == 1
    assert sorted(g["duplicate"] for g in shares) == [False] + [True] * 7
    assert await _in_flight(client) == 9


async def test_concurrent_different_tasks_under_one_id_admit_one(make_api):
    _, client = await make_api()
    bodies = [{"tasks": [{**MATH, "id": "contested", "n": n}]} for n in range(1, 9)]
    answers = await asyncio.gather(*(client.post("/v1/rollouts", json=b) for b in bodies))
    admitted = [r for r in answers if r.status_code == 202]
    assert len(admitted) == 1 and not admitted[0].json()["groups"][0]["duplicate"]
    for r in answers:
        if r.status_code != 202:
            assert r.status_code == 409, r.text
            (error,) = r.json()["errors"]
            assert error["field"] == "tasks[0].id" and "different task" in error["message"]
    n = len(admitted[0].json()["groups"][0]["rollout_ids"])
    assert await _in_flight(client) == n
