"""Over-sampling with early stop, the zero-variance filter and the group's usable flag,
through the HTTP API with the scripted fake vLLM: some samples slow, some wrong, some
masked (the fake answers a 400, an infrastructure failure)."""

from __future__ import annotations

import asyncio
import itertools

import httpx

from rollserve.api.app import create_app
from rollserve.engine.pipeline import EngineConfig
from rollserve.engine.store import SQLiteStore
from rollserve.server import ServerConfig, Service
from rollserve.testing import FakeVLLM

MATH = {"data_source": "math", "instance": {"question": "What is 2 + 2?", "answer": "4"}}
SLOW = 300.0  # seconds a slow sample would take: far past every wait below


async def _results(client: httpx.AsyncClient) -> list[dict]:
    page = (await client.get("/v1/results", params={"limit": 1000})).json()
    return page["results"]


def _metric(text: str, line_start: str) -> float:
    (line,) = [line for line in text.splitlines() if line.startswith(line_start + " ")]
    return float(line.split()[-1])


async def test_oversampling_cancels_the_extras_once_n_are_usable(make_api):
    """n=2 of 5 started: one masked (a 400), one wrong (usable, reward 0), one right, two
    slow. Once two are usable the slow ones are cancelled: their LLM calls end, they are
    masked, never used, and the group is usable with exactly n used."""
    replies = itertools.count()

    async def reply(prompt_ids: list[int], text: str) -> str:
        k = next(replies)
        if k == 0:
            return "It is \\boxed{5}"  # wrong: scored 0, still usable
        if k == 1:
            return "It is \\boxed{4}"
        await asyncio.sleep(SLOW)
        return "It is \\boxed{4}"

    async with FakeVLLM("smollm2", replies=reply) as llm:
        llm.fail_next(1, status=400)  # the first call: an infrastructure failure, masked
        _, client = await make_api([llm.url])
        r = await client.post(
            "/v1/rollouts", json={"tasks": [{**MATH, "n": 2, "oversample": 3}], "sampling": {"max_tokens": 64}}
        )
        assert r.status_code == 202, r.text
        (accepted,) = r.json()["groups"]
        assert len(accepted["rollout_ids"]) == 5
        view = (await client.get(f"/v1/groups/{accepted['group_id']}", params={"wait": 60})).json()
        assert view["done"], view["status_counts"]  # the slow ones did not run their 300 s
        assert view["usable"] is True and view["reasons"] == []
        assert view["n"] == 2 and view["oversample"] == 3
        assert view["counts"] == {
            "started": 5,
            "finished": 5,
            "usable": 2,
            "used": 2,
            "cancelled": 2,
            "masked": 1,
            "filtered": 0,
        }
        assert view["status_counts"] == {"completed": 2, "failed": 1, "cancelled": 2}
        used = [m for m in view["rollouts"] if m["used"]]
        assert len(used) == 2
        assert sorted(m["result"]["reward"] for m in used) == [0.0, 1.0]
        for member in view["rollouts"]:
            result = member["result"]
            if member["status"] == "cancelled":
                assert not member["used"] and result["mask"] is True
                assert "early stop" in result["failure"]["message"]
        # The cancelled samples' LLM calls are no longer in flight on rollserve's side.
        (backend,) = (await client.get("/v1/llm/backends")).json()["backends"]
        assert backend["outstanding"] == 0
        # The results cursor: no cancelled sample comes back unmasked or with a reward.
        results = await _results(client)
        assert len(results) == 5
        for result in results:
            if result["status"] == "cancelled":
                assert result["mask"] is True and result["reward"] is None
        status = (await client.get("/v1/status")).json()
        assert status["groups"] == {
            "samples_started": 5,
            "samples_usable": 2,
            "samples_used": 2,
            "samples_cancelled": 2,
            "groups_settled": 1,
            "groups_usable": 1,
            "groups_too_few_usable": 0,
            "groups_filtered": 0,
        }
        metrics = (await client.get("/metrics")).text
        assert _metric(metrics, 'rollserve_group_samples_total{what="cancelled"}') == 2
        assert _metric(metrics, 'rollserve_group_samples_total{what="used"}') == 2


async def test_a_group_short_of_n_usable_says_so(make_api):
    """Two of three samples masked: one usable of the two wanted, and the group says why."""
    async with FakeVLLM("smollm2", replies=["It is \\boxed{4}"]) as llm:
        llm.fail_next(2, status=400)
        _, client = await make_api([llm.url])
        r = await client.post(
            "/v1/rollouts", json={"tasks": [{**MATH, "n": 2, "oversample": 1}], "sampling": {"max_tokens": 64}}
        )
        group_id = r.json()["groups"][0]["group_id"]
        view = (await client.get(f"/v1/groups/{group_id}", params={"wait": 60})).json()
        assert view["done"] and view["usable"] is False
        assert view["reasons"] == ["too_few_usable"]
        assert view["counts"]["usable"] == view["counts"]["used"] == 1
        assert view["counts"]["masked"] == 2 and view["counts"]["cancelled"] == 0
        status = (await client.get("/v1/status")).json()["groups"]
        assert status["groups_too_few_usable"] == 1 and status["groups_usable"] == 0


async def test_zero_variance_groups_are_filtered(make_api):
    """DAPO's filter: a group whose rewards all agree is flagged, one with a spread is not."""
    other = {"data_source": "math", "instance": {"question": "What is 3 + 3?", "answer": "6"}}
    spread = itertools.count()

    def reply(prompt_ids: list[int], text: str) -> str:
        if "3 + 3" in text:
            return "It is \\boxed{6}" if next(spread) % 2 == 0 else "It is \\boxed{7}"
        return "It is \\boxed{4}"

    async with FakeVLLM("smollm2", replies=reply) as llm:
        _, client = await make_api([llm.url])
        r = await client.post(
            "/v1/rollouts",
            json={
                "tasks": [
                    {**MATH, "n": 3, "filter_zero_variance": True},
                    {**other, "n": 2, "filter_zero_variance": True},
                    {**MATH, "n": 2},
                ],
                "sampling": {"max_tokens": 64},
            },
        )
        assert r.status_code == 202, r.text
        same, mixed, unfiltered = (g["group_id"] for g in r.json()["groups"])
        view = (await client.get(f"/v1/groups/{same}", params={"wait": 60})).json()
        assert view["done"] and view["usable"] is False and view["reasons"] == ["zero_variance"]
        assert view["counts"]["used"] == 3 and view["counts"]["filtered"] == 3
        view = (await client.get(f"/v1/groups/{mixed}", params={"wait": 60})).json()
        assert view["done"] and view["usable"] is True and view["counts"]["filtered"] == 0
        view = (await client.get(f"/v1/groups/{unfiltered}", params={"wait": 60})).json()
        assert view["usable"] is True and view["filter_zero_variance"] is False
        status = (await client.get("/v1/status")).json()["groups"]
        assert status["groups_filtered"] == 1 and status["groups_usable"] == 2
        metrics = (await client.get("/metrics")).text
        assert _metric(metrics, 'rollserve_groups_total{what="filtered"}') == 1


async def test_bad_oversampling_settings_name_the_field(make_api):
    _, client = await make_api(max_pending=10)
    r = await client.post("/v1/rollouts", json={"tasks": [{**MATH, "oversample": -1}]})
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "tasks[0].oversample"
    assert "greater than or equal to 0" in r.text
    r = await client.post("/v1/rollouts", json={"tasks": [{**MATH, "filter_zero_variance": True}]})
    assert r.status_code == 422 and "n >= 2" in r.text
    assert r.json()["errors"][0]["field"] == "tasks[0].filter_zero_variance"
    # n + oversample rollouts are admitted: more than max_pending is refused whole.
    r = await client.post("/v1/rollouts", json={"tasks": [{**MATH, "n": 8, "oversample": 3}]})
    assert r.status_code == 422 and "needs 11 rollout slots" in r.text, r.text
    assert (await client.get("/v1/status")).json()["in_flight"] == 0
    r = await client.post("/v1/rollouts", json={"tasks": [{**MATH, "n": 7, "oversample": 3}]})
    assert r.status_code == 202 and len(r.json()["groups"][0]["rollout_ids"]) == 10


async def _serve(state_dir, backends: list[str]) -> tuple[Service, httpx.AsyncClient]:
    service = Service(ServerConfig(state_dir=state_dir, backends=backends, engine=EngineConfig()))
    await service.start()
    app = create_app(service, manage_lifecycle=False)
    return service, httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://rollserve", timeout=30)


async def test_a_restarted_server_does_not_rerun_an_extra_its_group_no_longer_needs(tmp_path):
    """The server dies after a group's n-th usable result is stored and before its extra
    is cancelled: the restarted server ends the extra as cancelled and never runs it."""
    replies = itertools.count()

    async def reply(prompt_ids: list[int], text: str) -> str:
        if next(replies) > 0:
            await asyncio.sleep(SLOW)
        return "It is \\boxed{4}"

    state = tmp_path / "state"
    async with FakeVLLM("smollm2", replies=reply) as llm:
        service, client = await _serve(state, [llm.url])
        try:
            r = await client.post(
                "/v1/rollouts", json={"tasks": [{**MATH, "n": 1, "oversample": 1}], "sampling": {"max_tokens": 64}}
            )
            group_id = r.json()["groups"][0]["group_id"]
            view = (await client.get(f"/v1/groups/{group_id}", params={"wait": 60})).json()
            assert view["done"] and view["counts"]["cancelled"] == 1
        finally:
            await client.aclose()
            await service.stop()
    (extra,) = [m["id"] for m in view["rollouts"] if m["status"] == "cancelled"]
    # What the store holds when the server is killed between the two writes: the n-th
    # usable result stored, the extra still unfinished (in RUN).
    store = SQLiteStore(state / "rollserve.db")
    await store.open()
    await store._call(
        lambda conn: conn.execute(
            "UPDATE rollouts SET status='run', result=NULL, seq=NULL, usable=NULL, reward=NULL,"
            " masked=NULL, finished_at=NULL WHERE id=?",
            (extra,),
        )
    )
    await store.close()

    async with FakeVLLM("smollm2", replies=["It is \\boxed{4}"]) as llm:
        service, client = await _serve(state, [llm.url])
        try:
            status = (await client.get("/v1/status")).json()
            assert status["recovered_at_start"]["cancelled"] == 1
            assert status["recovered_at_start"]["requeued"] == 0
            view = (await client.get(f"/v1/groups/{group_id}", params={"wait": 30})).json()
            assert view["done"] and view["usable"] is True
            assert view["counts"]["used"] == 1 and view["counts"]["cancelled"] == 1
            member = next(m for m in view["rollouts"] if m["id"] == extra)
            assert member["status"] == "cancelled" and member["result"]["mask"] is True
            assert llm.calls == []  # the extra was not run again
        finally:
            await client.aclose()
            await service.stop()
