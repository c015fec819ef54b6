"""Bodies of a thousand tasks and more through the HTTP API: one admitted whole (every
rollout in flight, counted by status), a hostile one refused whole naming the field
(too many tasks, one bad task at the end, more rollouts than --max-pending ever
admits, more than there is room for now), and nothing of a refused one admitted."""

from __future__ import annotations

MATH = {"data_source": "math", "instance": {"question": "What is 2 + 2?", "answer": "4"}}


def tasks(count: int, n: int = 1) -> list[dict]:
    return [
        {**MATH, "n": n, "instance": {"question": f"What is {i} + {i}?", "answer": str(2 * i)}} for i in range(count)
    ]


async def refused(client, body: dict, field: str, status: int = 422) -> dict:
    r = await client.post("/v1/rollouts", json=body)
    assert r.status_code == status, (r.status_code, r.text[:500])
    answer = r.json()
    assert [e["field"] for e in answer["errors"]] == [field], answer
    return answer


async def test_a_thousand_task_body_is_admitted_whole(make_api):
    # No backend: the rollouts wait for one, in flight, until the service stops.
    _, client = await make_api(max_pending=3000)
    r = await client.post("/v1/rollouts", json={"tasks": tasks(1000, n=2)})
    assert r.status_code == 202, r.text[:500]
    groups = r.json()["groups"]
    assert len(groups) == 1000 and len({g["group_id"] for g in groups}) == 1000
    ids = [rid for g in groups for rid in g["rollout_ids"]]
    assert len(ids) == len(set(ids)) == 2000
    status = (await client.get("/v1/status")).json()
    assert status["in_flight"] == 2000 and sum(status["live"].values()) == 2000
    got = (await client.get(f"/v1/rollouts/{ids[-1]}")).json()
    assert got["done"] is False and got["group_id"] == groups[-1]["group_id"]


async def test_hostile_large_bodies_are_refused_whole_naming_the_field(make_api):
    _, client = await make_api(max_pending=1500)
    await refused(client, {"tasks": tasks(10_001)}, "tasks")
    bad = tasks(1000)
    bad[999] = {**MATH, "instance": {"question": "What is 2 + 2?"}}
    await refused(client, {"tasks": bad}, "tasks[999].instance.answer")
    body = await refused(client, {"tasks": tasks(1000, n=2)}, "tasks")  # 2,000 > 1,500, ever
    assert "at most 1500" in body["detail"]
    status = (await client.get("/v1/status")).json()
    assert status["in_flight"] == 0 and status["live"] == {}  # nothing of them admitted
    assert (await client.post("/v1/rollouts", json={"tasks": tasks(1000)})).status_code == 202
    r = await client.post("/v1/rollouts", json={"tasks": tasks(1000)})  # 1,000 more: room for 500
    assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1, r.text[:500]
    assert (await client.get("/v1/status")).json()["in_flight"] == 1000
