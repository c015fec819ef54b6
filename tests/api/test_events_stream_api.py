"""``GET /v1/events`` does not hold its task for a client that reads nothing (a send
timeout, as the status stream's), and a shutdown ends it and the long-polls at once."""

from __future__ import annotations

import asyncio

from rollserve.api import routes_rollouts
from rollserve.api.app import create_app
from tests.api.stuck_client import scope, serve_stuck
from tests.waiting import eventually

MATH = {"data_source": "math", "instance": {"question": "What is 2 + 2?", "answer": "4"}}


async def test_a_client_that_stops_reading_the_events_does_not_hold_the_stream(make_api, monkeypatch):
    # A client whose socket buffers are full: the server's send never returns. The stream
    # must end (its send times out) rather than hold its generator and subscription.
    monkeypatch.setattr(routes_rollouts, "EVENTS_SEND_TIMEOUT", 0.5)
    service, client = await make_api()
    app = create_app(service, manage_lifecycle=False)
    served, started = serve_stuck(app, scope("/v1/events"))
    try:
        async with asyncio.timeout(30):
            await started.wait()
        # An event to send: a rollout's state changes as it is admitted.
        assert (await client.post("/v1/rollouts", json={"tasks": [MATH]})).status_code == 202
        done, _ = await asyncio.wait({served}, timeout=30)
        assert served in done, "the stream still waits on a client that reads nothing"
        assert isinstance(served.exception(), TimeoutError | None)
    finally:
        served.cancel()


async def test_a_shutdown_answers_the_long_polls_and_ends_the_streams(make_api):
    service, client = await make_api()  # no backend: the rollout stays queued
    r = await client.post("/v1/rollouts", json={"tasks": [MATH]})
    group = r.json()["groups"][0]
    (rollout_id,) = group["rollout_ids"]
    subscribed = service.engine.events.subscribers
    calls = {
        "results": client.get("/v1/results", params={"wait": 600}),
        "rollout": client.get(f"/v1/rollouts/{rollout_id}", params={"wait": 600}),
        "group": client.get(f"/v1/groups/{group['group_id']}", params={"wait": 600}),
        "events": client.get("/v1/events"),
        "status": client.get("/v1/status/stream", params={"interval": 60}),
        "gateway": client.get(f"/v1/rollouts/{rollout_id}/gateway", params={"wait": 600}),
    }
    tasks = {name: asyncio.ensure_future(call) for name, call in calls.items()}
    await eventually(
        lambda: service.engine.events.subscribers != subscribed,
        timeout=30,
        what="the event stream to subscribe (then the calls are in)",
    )
    assert not any(task.done() for task in tasks.values())
    service.begin_shutdown()
    done, _ = await asyncio.wait(tasks.values(), timeout=30)
    assert len(done) == len(tasks), [n for n, t in tasks.items() if t not in done]
    answers = {name: task.result() for name, task in tasks.items()}
    # A math rollout never opens a gateway session: that wait ends with its 404 now.
    assert answers.pop("gateway").status_code == 404
    assert all(a.status_code == 200 for a in answers.values())
    assert answers["results"].json() == {"results": [], "next": 0}
    assert answers["rollout"].json()["done"] is False
    assert answers["group"].json()["done"] is False
    assert "event: status" in answers["status"].text
    # ...and a long-poll that comes in while the service shuts down answers at once.
    late = await asyncio.wait_for(client.get("/v1/results", params={"wait": 600}), 30)
    assert late.status_code == 200
