"""Re-scoring under an idempotency key, through the HTTP API and the CLI: a trainer
that retries ``POST /v1/results/rescore`` (after a timeout, a dropped connection) must
not get the batch scored twice, since each re-scoring writes new results to the cursor
and a trainer could take them twice. The same key and body get the first answer (the
same new ids, no judge call more); a retry while the first still runs waits for it, or
after the server's bound gets a 409 with Retry-After (the run goes on); the same key
with another body is a 409 naming ``idempotency_key``; ``rollserve rescore`` sends a
key of its own and retries on it."""

from __future__ import annotations

import asyncio
import socket

import pytest
import uvicorn
from typer.testing import CliRunner

from rollserve.api.app import create_app
from rollserve.client import Client
from rollserve.commands.app import app
from rollserve.testing import FakeVLLM
from tests.judges.judge_doubles import TAG, math_task, results, submit
from tests.waiting import eventually


def policy(prompt_ids, prompt: str) -> str:
    return {"right": "So \\boxed{7}", "wrong": "So \\boxed{9}"}[TAG.findall(prompt)[0]]


@pytest.fixture
async def doubles(tok):
    async with FakeVLLM(tok, replies=policy) as pol, FakeVLLM(tok, replies="Fine.\nSCORE: 8") as judge:
        yield pol, judge


async def stored(make_api, doubles, n: int = 2):
    pol, judge = doubles
    service, client = await make_api([pol.url], server={"judges": [f"j={judge.url}"]})
    ids = await submit(client, [math_task("right"), math_task("wrong")][:n])
    await results(client, ids)
    return service, client, ids


async def rescored_in_cursor(client) -> list[dict]:
    page = (await client.get("/v1/results", params={"after": 0, "rescored": "true"})).json()
    return list(page["results"])


async def test_a_retry_under_the_same_key_gets_the_first_answer_not_a_second_run(make_api, doubles):
    _, judge = doubles
    _, client, ids = await stored(make_api, doubles)
    body = {"result_ids": ids, "judge": {"rubric": "default"}, "idempotency_key": "step-7"}
    first = await client.post("/v1/results/rescore", json=body)
    assert first.status_code == 200, first.text
    again = await client.post("/v1/results/rescore", json=body)
    assert again.status_code == 200, again.text
    assert again.json() == first.json()
    assert len(judge.calls) == 2  # one per result, once
    assert {r["id"] for r in await rescored_in_cursor(client)} == {n["id"] for n in first.json()["results"]}

    # the key with another body: a 409 naming it, nothing run
    for other in ({**body, "judge": None}, {**body, "result_ids": ids[:1]}):
        r = await client.post("/v1/results/rescore", json=other)
        assert r.status_code == 409, r.text
        assert r.json()["errors"][0]["field"] == "idempotency_key", r.json()
    assert len(judge.calls) == 2
    # a key that is no key: a 422 naming it
    for bad in ("", "a b", "x" * 201):
        r = await client.post("/v1/results/rescore", json={**body, "idempotency_key": bad})
        assert r.status_code == 422 and "idempotency_key" in r.text, r.text
    # no key: each request is a re-scoring of its own, as before
    for _ in range(2):
        r = await client.post("/v1/results/rescore", json={"result_ids": ids})
        assert r.status_code == 200, r.text
    assert len(await rescored_in_cursor(client)) == 2 + 2 * 2


async def test_a_retry_while_the_first_runs_waits_for_its_answer(make_api, doubles):
    _, judge = doubles
    service, client, ids = await stored(make_api, doubles)
    rescores = service.rollouts.rescores
    body = {"result_ids": ids, "judge": {"rubric": "default"}, "idempotency_key": "k1"}
    judge.pause("hold")
    first = asyncio.create_task(client.post("/v1/results/rescore", json=body))
    await eventually(lambda: len(judge.calls) == 2, timeout=60, what="the first run's judge calls")
    retry = asyncio.create_task(client.post("/v1/results/rescore", json=body))
    await eventually(lambda: rescores.waiting("k1") == 2, timeout=60, what="the retry to join")
    judge.resume()
    one, two = await asyncio.wait_for(asyncio.gather(first, retry), 120)
    assert one.status_code == two.status_code == 200, (one.text, two.text)
    assert one.json() == two.json()
    assert len(judge.calls) == 2 and len(await rescored_in_cursor(client)) == 2


async def test_past_the_bound_a_retry_is_a_409_with_retry_after_and_the_run_goes_on(make_api, doubles):
    _, judge = doubles
    service, client, ids = await stored(make_api, doubles)
    service.rollouts.rescores.wait = 0.2  # (the server's bound, MAX_WAIT, made short)
    body = {"result_ids": ids, "idempotency_key": "k2", "judge": {"rubric": "default"}}
    judge.pause("hold")
    for _ in range(2):  # the first request, then a retry: each told to ask again
        r = await client.post("/v1/results/rescore", json=body)
        assert r.status_code == 409, r.text
        assert r.json()["errors"][0]["field"] == "idempotency_key"
        assert r.json()["retry_after"] > 0 and int(r.headers["retry-after"]) >= 1
    assert len(judge.calls) == 2  # one run
    judge.resume()
    await eventually(lambda: service.rollouts.rescores.running() == [], timeout=60, what="the run to end")
    r = await client.post("/v1/results/rescore", json=body)
    assert r.status_code == 200, r.text
    assert len(judge.calls) == 2 and len(await rescored_in_cursor(client)) == 2
    assert [n["rescored_from"] for n in r.json()["results"]] == ids


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_the_cli_and_the_client_retry_on_their_key_without_a_second_run(make_api, doubles):
    """Over real HTTP: the server's bound made short, a judge that holds its calls; the
    CLI (its own key) and the client (a key given) are told "still running", retry,
    and get the one run's answer once the judge answers."""
    _, judge = doubles
    service, _, ids = await stored(make_api, doubles)
    service.rollouts.rescores.wait = 0.2
    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(service, manage_lifecycle=False), host="127.0.0.1", port=port, log_level="warning")
    )
    serving = asyncio.create_task(server.serve())
    url = f"http://127.0.0.1:{port}"
    try:
        await eventually(lambda: server.started, timeout=30, what="the server to start")
        judge.pause("hold")
        cli = asyncio.create_task(
            asyncio.to_thread(
                CliRunner().invoke,
                app,
                ["rescore", "--server", url, "--id", ids[0], "--rubric", "default", "--timeout", "120"],
            )
        )
        await eventually(lambda: len(judge.calls) == 1, timeout=60, what="the CLI's run")

        def by_client() -> list[str]:
            with Client(url, timeout=30) as client:
                answer = client.rescore([ids[1]], judge={"rubric": "default"}, idempotency_key="trainer-1")
            return [n.rescored_from for n in answer.results]

        trainer = asyncio.create_task(asyncio.to_thread(by_client))
        await eventually(lambda: len(judge.calls) == 2, timeout=60, what="the client's run")
        # both runs going, both requests told to ask again (none waits on a run now)
        rescores = service.rollouts.rescores
        await eventually(
            lambda: len(rescores.running()) == 2 and not any(rescores.waiting(key) for key in rescores.running()),
            timeout=30,
            what="both requests told to ask again",
        )
        judge.resume()
        done = await asyncio.wait_for(cli, 120)
        assert done.exit_code == 0, done.output
        assert await asyncio.wait_for(trainer, 120) == [ids[1]]
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 30)
    assert len(judge.calls) == 2  # each re-scored once, whatever the retries
    assert ids[0] in done.output


async def test_the_key_may_come_as_an_idempotency_key_header(make_api, doubles):
    _, judge = doubles
    _, client, ids = await stored(make_api, doubles)
    body = {"result_ids": ids}
    first = await client.post("/v1/results/rescore", json=body, headers={"Idempotency-Key": "h1"})
    assert first.status_code == 200, first.text
    for again in (
        (body, {"Idempotency-Key": "h1"}),
        ({**body, "idempotency_key": "h1"}, {}),
        ({**body, "idempotency_key": "h1"}, {"Idempotency-Key": "h1"}),
    ):
        r = await client.post("/v1/results/rescore", json=again[0], headers=again[1])
        assert r.status_code == 200 and r.json() == first.json(), r.text
    assert len(await rescored_in_cursor(client)) == 2
    for bad_body, header in (({**body, "idempotency_key": "h2"}, "h1"), (body, "a b")):
        r = await client.post("/v1/results/rescore", json=bad_body, headers={"Idempotency-Key": header})
        assert r.status_code == 422, r.text
        assert r.json()["errors"][0]["field"] == "idempotency_key", r.json()
    r = await client.post("/v1/results/rescore", json={"result_ids": ids[:1]}, headers={"Idempotency-Key": "h1"})
    assert r.status_code == 409 and r.json()["errors"][0]["field"] == "idempotency_key"
    assert len(judge.calls) == 0  # (no judge asked: the family's own grader)
