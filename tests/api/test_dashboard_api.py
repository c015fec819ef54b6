"""The dashboard's routes: its static files (public, under a strict CSP, nothing else
served), the status stream, the filtered results table and the token texts, behind
--api-token; bad parameters are a 422 naming the field."""

import asyncio
import json
import sqlite3

import httpx
import pytest

from rollserve.api import routes_ui
from rollserve.api.app import create_app
from rollserve.contract import ResultSummaryPage, ServiceStatus, TokenTexts
from rollserve.testing import FakeVLLM
from tests.api.stuck_client import scope, serve_stuck

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def policy(prompt_ids: list[int], prompt: str) -> str:
    # Right on "2 + 2", wrong on everything else.
    return "Adding: \\boxed{4}" if "2 + 2" in prompt else "I think \\boxed{7}"


def math(question: str, answer: str) -> dict:
    return {"data_source": "math", "instance": {"question": question, "answer": answer}}


async def _run(client: httpx.AsyncClient, body: dict) -> list[str]:
    r = await client.post("/v1/rollouts", json=body, headers=AUTH)
    assert r.status_code == 202, r.text
    ids = [rid for g in r.json()["groups"] for rid in g["rollout_ids"]]
    for rid in ids:
        view = (await client.get(f"/v1/rollouts/{rid}", params={"wait": 60}, headers=AUTH)).json()
        assert view["done"], view
    return ids


async def test_pages_are_public_and_strict_data_needs_the_token(make_api):
    _, client = await make_api(token=TOKEN)
    r = await client.get("/ui")
    assert r.status_code == 307 and r.headers["location"] == "ui/"
    r = await client.get("/ui/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "connect-src 'self'" in csp and "default-src 'none'" in csp
    assert "unsafe-inline" not in csp and r.headers["referrer-policy"] == "no-referrer"
    assert TOKEN not in r.text
    js = await client.get("/ui/api.js")
    assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
    assert "sessionStorage" in js.text and "Authorization" in js.text
    for path in ("/ui/nope.js", "/ui/../v1/status", "/ui/%2e%2e/v1/status", "/ui/..%2fv1%2fstatus"):
        r = await client.get(path)
        assert r.status_code in (401, 404), (path, r.status_code)
        assert "stages" not in r.text
    for path in ("/v1/status/stream", "/v1/results/summaries", "/v1/rollouts/x/tokens"):
        assert (await client.get(path)).status_code == 401, path
    assert (await client.get("/v1/results/summaries", headers=AUTH)).status_code == 200


async def test_results_table_filters_and_pages_and_token_texts(make_api, tok):
    async with FakeVLLM("smollm2", replies=policy, latency=0.01) as llm:
        service, client = await make_api([llm.url], token=TOKEN)
        right = await _run(client, {"tasks": [{**math("What is 2 + 2?", "4"), "n": 3}]})
        wrong = await _run(client, {"tasks": [{**math("What is 3 + 5?", "8"), "n": 2}]})
        llm.fail_next(4, mode="error", status=500)  # every try of its one call (max_attempts)
        (infra,) = await _run(client, {"tasks": [math("What is 2 + 2?", "4")]})
        llm.fail_next(1, mode="hang")
        (late,) = await _run(client, {"tasks": [math("What is 2 + 2?", "4")], "timeouts": {"run": 0.5}})

        async def page(**params) -> ResultSummaryPage:
            r = await client.get("/v1/results/summaries", params=params, headers=AUTH)
            assert r.status_code == 200, r.text
            return ResultSummaryPage.model_validate(r.json())

        everything = await page()
        assert everything.total == 7 and everything.next_before is None
        assert [s.seq for s in everything.summaries] == sorted((s.seq for s in everything.summaries), reverse=True)
        assert {s.id: s.reward for s in everything.summaries if s.id in right + wrong} == {
            **{rid: 1.0 for rid in right},
            **{rid: 0.0 for rid in wrong},
        }
        only = await page(failure_kind="infra")
        assert [(s.id, s.masked, s.status) for s in only.summaries] == [(infra, True, "failed")]
        only = await page(status="timed_out")
        assert [(s.id, s.failure_kind) for s in only.summaries] == [(late, "timeout")]
        unmasked = await page(masked="false", data_source="math")
        assert {s.id for s in unmasked.summaries} == set(right + wrong) and unmasked.total == 5
        assert (await page(failure_kind="none")).total == 5
        assert (await page(data_source="code")).total == 0

        seen, before = [], None
        while True:
            part = await page(limit=2, **({} if before is None else {"before": before}))
            assert part.total == 7 and len(part.summaries) <= 2
            seen += [s.id for s in part.summaries]
            before = part.next_before
            if before is None:
                break
        assert seen == [s.id for s in everything.summaries]  # each once, newest first

        for params, field in (
            ({"status": "done"}, "status"),
            ({"limit": 0}, "limit"),
            ({"before": 0}, "before"),
            ({"masked": "maybe"}, "masked"),
            ({"failure_kind": "oops"}, "failure_kind"),
            ({"data_source": ""}, "data_source"),
        ):
            r = await client.get("/v1/results/summaries", params=params, headers=AUTH)
            assert r.status_code == 422 and r.json()["errors"][0]["field"] == field, (params, r.text)

        result = (await client.get(f"/v1/rollouts/{right[0]}", headers=AUTH)).json()["result"]
        r = await client.get(f"/v1/rollouts/{right[0]}/tokens", headers=AUTH)
        assert r.status_code == 200, r.text
        texts = TokenTexts.model_validate(r.json())
        input_ids = result["trajectory"]["tokens"]["input_ids"]
        assert texts.ids == sorted(set(input_ids))
        by_id = dict(zip(texts.ids, texts.texts, strict=True))
        assert "".join(by_id[i] for i in input_ids) == tok.decode(input_ids)  # ASCII episode
        assert (await client.get("/v1/rollouts/nope/tokens", headers=AUTH)).status_code == 404

        status = ServiceStatus.model_validate((await client.get("/v1/status", headers=AUTH)).json())
        results = (await client.get("/v1/results", params={"limit": 100}, headers=AUTH)).json()
        assert status.trajectories.output_tokens == sum(r["stats"]["output_tokens"] for r in results["results"]) > 0
        assert status.trajectories.prompt_tokens == sum(r["stats"]["prompt_tokens"] for r in results["results"]) > 0
        assert service.rollouts.status().trajectories.output_tokens == status.trajectories.output_tokens


async def test_status_stream_sends_snapshots_and_refuses_a_bad_interval(make_api):
    _, client = await make_api(token=TOKEN)
    r = await client.get("/v1/status/stream", params={"interval": 0.2, "duration": 1}, headers=AUTH)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [block for block in r.text.replace("\r\n", "\n").split("\n\n") if "data:" in block]
    assert len(events) >= 2
    for block in events:
        lines = block.split("\n")
        assert "event: status" in lines
        data = "".join(line[len("data: ") :] for line in lines if line.startswith("data: "))
        ServiceStatus.model_validate(json.loads(data))
    for params, field in (({"interval": 0.1}, "interval"), ({"duration": 0}, "duration")):
        r = await client.get("/v1/status/stream", params=params, headers=AUTH)
        assert r.status_code == 422 and r.json()["errors"][0]["field"] == field


@pytest.mark.parametrize("path", ["/v1/results/summaries", "/v1/status/stream", "/v1/rollouts/{rollout_id}/tokens"])
async def test_the_schema_publishes_the_dashboard_routes(make_api, path):
    _, client = await make_api(token=TOKEN)
    schema = (await client.get("/openapi.json", headers=AUTH)).json()
    assert path in schema["paths"]
    assert "/ui/" not in schema["paths"] and "/ui" not in schema["paths"]


async def test_a_client_that_stops_reading_the_status_stream_does_not_hold_it(make_api, monkeypatch):
    # A client whose socket buffers are full: the server's send never returns. The stream
    # must end (its send times out) rather than hold its generator forever.
    monkeypatch.setattr(routes_ui, "STATUS_SEND_TIMEOUT", 0.5)
    service, _ = await make_api(token=TOKEN)
    app = create_app(service, manage_lifecycle=False)
    served, started = serve_stuck(app, scope("/v1/status/stream", b"interval=0.2", TOKEN))
    try:
        done, _ = await asyncio.wait({served}, timeout=30)
        assert started.is_set()
        assert served in done, "the stream still waits on a client that reads nothing"
        assert isinstance(served.exception(), TimeoutError | None)
    finally:
        served.cancel()


async def test_the_results_count_stops_at_its_cap(make_api):
    service, client = await make_api(token=TOKEN)
    # 10,005 finished rows, written straight into the store's file (the count reads only
    # the summary columns): more than the count walks.
    conn = sqlite3.connect(service.config.db_path)
    with conn:
        conn.executemany(
            "INSERT INTO rollouts (id, group_id, spec, status, seq, created_at, updated_at,"
            " masked, data_source) VALUES (?, 'g', '{}', ?, ?, 0, 0, 0, ?)",
            [
                (f"r{i}", "failed" if i % 1000 == 0 else "completed", i + 1, "code" if i == 7 else "math")
                for i in range(10_005)
            ],
        )
    conn.close()

    async def page(**params: str) -> ResultSummaryPage:
        r = await client.get("/v1/results/summaries", params=params, headers=AUTH)
        assert r.status_code == 200, r.text
        return ResultSummaryPage.model_validate(r.json())

    everything = await page(limit="3")
    assert (everything.total, everything.total_capped) == (10_000, True)
    assert [s.seq for s in everything.summaries] == [10_005, 10_004, 10_003]
    assert ((await page(data_source="code")).total, (await page(data_source="code")).total_capped) == (1, False)
    failed = await page(status="failed")
    assert (failed.total, failed.total_capped) == (11, False)
    math_page = await page(data_source="math")
    assert (math_page.total, math_page.total_capped) == (10_000, True)
