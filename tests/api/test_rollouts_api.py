import asyncio
import time

from tests.waiting import eventually

MATH = {"data_source": "math", "instance": {"question": "What is 2 + 2?", "answer": "4"}}


async def test_submit_then_wait_for_the_group(make_api, fake_llm):
    service, client = await make_api([fake_llm.url])
    r = await client.post("/v1/rollouts", json={"tasks": [{**MATH, "n": 3}], "sampling": {"max_tokens": 64}})
    assert r.status_code == 202, r.text
    (group,) = r.json()["groups"]
    assert len(group["rollout_ids"]) == 3
    view = (await client.get(f"/v1/groups/{group['group_id']}", params={"wait": 30})).json()
    assert view["done"] and view["status_counts"] == {"completed": 3}
    for item in view["rollouts"]:
        result = item["result"]
        assert result["reward"] == 1.0 and result["mask"] is False
        tokens = result["trajectory"]["tokens"]
        assert len(tokens["input_ids"]) == len(tokens["loss_mask"]) == len(tokens["logprobs"])
    one = (await client.get(f"/v1/rollouts/{group['rollout_ids'][0]}")).json()
    assert one["done"] and one["result"]["status"] == "completed"


async def test_bad_input_names_the_field(make_api):
    _, client = await make_api()
    r = await client.post("/v1/rollouts", json={"tasks": [{**MATH, "n": 0}]})
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "tasks[0].n"
    r = await client.post("/v1/rollouts", json={"tasks": [{**MATH, "sampling": {"temprature": 1}}]})
    assert r.status_code == 422 and "tasks[0].sampling.temprature" in r.json()["detail"]
    r = await client.post("/v1/rollouts", json={"tasks": [{"data_source": "nope", "instance": {}}]})
    assert r.status_code == 400 and r.json()["errors"][0]["field"] == "tasks[0].data_source"
    assert "known: " in r.json()["detail"]
    r = await client.post("/v1/rollouts", json={"tasks": [MATH, {"data_source": "math", "instance": {"answer": "1"}}]})
    assert r.status_code == 422 and r.json()["errors"][0]["field"].startswith("tasks[1].instance")
    status = (await client.get("/v1/status")).json()
    assert status["in_flight"] == 0 and status["last_seq"] == 0  # nothing half-done


async def test_full_queue_answers_429_with_retry_after(make_api):
    _, client = await make_api(max_pending=2)  # no backend: rollouts wait in RUN
    r = await client.post("/v1/rollouts", json={"tasks": [{**MATH, "n": 2}]})
    assert r.status_code == 202
    r = await client.post("/v1/rollouts", json={"tasks": [MATH]})
    assert r.status_code == 429
    assert int(r.headers["retry-after"]) >= 1 and "retry" in r.json()["detail"]


async def test_rollouts_wait_for_a_backend_registered_later(make_api, fake_llm):
    _, client = await make_api()
    r = await client.post("/v1/rollouts", json={"tasks": [{**MATH, "n": 2}]})
    group_id = r.json()["groups"][0]["group_id"]

    async def waiting_in_run():
        status = (await client.get("/v1/status")).json()
        return status["stages"]["run"]["busy"] == 2 and status["backends"] == []

    await eventually(waiting_in_run, what="both rollouts waiting in RUN with no backend")
    r = await client.post("/v1/llm/backends", json={"url": fake_llm.url, "name": "fake"})
    assert r.status_code == 201, r.text
    view = (await client.get(f"/v1/groups/{group_id}", params={"wait": 30})).json()
    assert view["status_counts"] == {"completed": 2}
    listed = (await client.get("/v1/llm/backends")).json()["backends"]
    assert [b["name"] for b in listed] == ["fake"]
    assert (await client.post("/v1/llm/backends", json={"url": fake_llm.url, "name": "fake"})).status_code == 409
    assert (await client.delete("/v1/llm/backends/fake")).status_code == 200
    assert (await client.delete("/v1/llm/backends/fake")).status_code == 404


async def test_a_rollout_waiting_for_a_backend_times_out_typed(make_api):
    _, client = await make_api()
    r = await client.post("/v1/rollouts", json={"tasks": [MATH], "timeouts": {"total": 0.5}})
    rid = r.json()["groups"][0]["rollout_ids"][0]
    view = (await client.get(f"/v1/rollouts/{rid}", params={"wait": 10})).json()
    assert view["status"] == "timed_out"
    assert view["result"]["failure"]["stage"] == "run" and view["result"]["mask"] is True


async def test_cancel_a_rollout_and_a_group(make_api):
    _, client = await make_api()  # no backend: everything waits in RUN
    r = await client.post("/v1/rollouts", json={"tasks": [{**MATH, "n": 3}, MATH]})
    g1, g2 = r.json()["groups"]

    async def in_run():
        return (await client.get("/v1/status")).json()["stages"]["run"]["busy"] == 4

    await eventually(in_run, what="the four rollouts waiting in RUN")
    r = await client.delete(f"/v1/rollouts/{g2['rollout_ids'][0]}")
    assert r.json() == {"id": g2["rollout_ids"][0], "cancelled": True, "status": "cancelled"}
    r = await client.delete(f"/v1/groups/{g1['group_id']}")
    assert sorted(r.json()["cancelled"]) == sorted(g1["rollout_ids"])
    view = (await client.get(f"/v1/groups/{g1['group_id']}")).json()
    assert view["status_counts"] == {"cancelled": 3}
    assert (await client.delete("/v1/rollouts/nope")).status_code == 404


async def test_results_cursor_pages_without_gaps_or_duplicates(make_api, fake_llm):
    _, client = await make_api([fake_llm.url])
    await client.post("/v1/rollouts", json={"tasks": [{**MATH, "n": 5}]})
    seen, cursor = [], 0
    while len(seen) < 5:
        page = (await client.get("/v1/results", params={"after": cursor, "limit": 2, "wait": 10})).json()
        assert len(page["results"]) <= 2
        seen += [r["seq"] for r in page["results"]]
        cursor = page["next"]
    assert seen == [1, 2, 3, 4, 5]
    empty = (await client.get("/v1/results", params={"after": cursor, "wait": 0.2})).json()
    assert empty == {"results": [], "next": cursor}


async def test_idempotent_resubmission_by_client_id(make_api, fake_llm):
    _, client = await make_api([fake_llm.url])
    body = {"tasks": [{**MATH, "id": "task-7", "n": 2}]}
    first = (await client.post("/v1/rollouts", json=body)).json()["groups"][0]
    again = (await client.post("/v1/rollouts", json=body)).json()["groups"][0]
    assert again["duplicate"] and again["rollout_ids"] == first["rollout_ids"]
    body["tasks"][0]["n"] = 3
    r = await client.post("/v1/rollouts", json=body)
    assert r.status_code == 409 and r.json()["errors"][0]["field"] == "tasks[0].id"


async def test_run_endpoint_submits_and_waits(make_api, fake_llm):
    _, client = await make_api([fake_llm.url])
    r = await client.post("/v1/rollouts:run", json={"task": {**MATH, "n": 2}, "wait": 30})
    assert r.status_code == 200, r.text
    assert [x["reward"] for x in r.json()["results"]] == [1.0, 1.0]


async def test_bearer_token_guards_every_route_but_healthz(make_api):
    _, client = await make_api(token="s3cret")
    assert (await client.get("/healthz")).status_code == 200
    assert (await client.get("/v1/status")).status_code == 401
    assert (await client.post("/v1/rollouts", json={"tasks": [MATH]})).status_code == 401
    ok = await client.get("/v1/status", headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200
    schema = await client.get("/openapi.json", headers={"Authorization": "Bearer s3cret"})
    assert schema.json()["info"]["title"] == "rollserve"


async def test_prometheus_metrics(make_api, fake_llm):
    _, client = await make_api([fake_llm.url])
    await client.post("/v1/rollouts:run", json={"task": {**MATH, "n": 2}, "wait": 30})
    text = (await client.get("/metrics")).text
    assert 'rollserve_rollouts_finished_total{status="completed"} 2.0' in text
    assert 'rollserve_stage_workers{stage="run"}' in text
    assert "rollserve_llm_outstanding" in text


async def test_the_event_stream_can_end_by_itself(make_api):
    service, client = await make_api()
    subscribed = service.engine.events.subscribers

    async def submit_soon():  # once the stream is listening: it sees the state change
        await eventually(lambda: service.engine.events.subscribers != subscribed, what="the event stream to subscribe")
        return await client.post("/v1/rollouts", json={"tasks": [MATH]})

    started = time.monotonic()
    submitted = asyncio.create_task(submit_soon())
    r = await asyncio.wait_for(client.get("/v1/events", params={"duration": 1.5}), 30)
    assert (await submitted).status_code == 202
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert "event: state" in r.text and time.monotonic() - started < 20
