"""Re-scored results carry the same token ids, logprobs, policy version, task and
sample index as the results they score again; only ``rescored_from`` tells them apart.
They stay in the results cursor, and ``GET /v1/results?rescored=false|true|any``
(default any) filters them; the client's result streams (and ``rollserve run``, which
reads the cursor through the client) leave them out unless asked, so a trainer never
takes one sample twice."""

from __future__ import annotations

import httpx

from rollserve.api.app import create_app
from rollserve.client import AsyncClient
from rollserve.testing import FakeVLLM
from tests.judges.judge_doubles import math_task, results, submit


async def test_rescored_results_are_filtered_from_the_cursor(make_api, tok):
    async with FakeVLLM(tok, replies="So \\boxed{7}") as pol:
        service, client = await make_api([pol.url])
        ids = await submit(client, [math_task("a"), math_task("b")])
        await results(client, ids)
        r = await client.post("/v1/results/rescore", json={"result_ids": ids})
        assert r.status_code == 200, r.text
        new = [n["id"] for n in r.json()["results"]]

        async def page(**params) -> dict:
            r = await client.get("/v1/results", params={"after": 0, **params})
            assert r.status_code == 200, r.text
            return r.json()

        every = await page()
        assert sorted(x["id"] for x in every["results"]) == sorted(ids + new)
        last = every["next"]
        originals = await page(rescored="false")
        assert sorted(x["id"] for x in originals["results"]) == sorted(ids)
        rescored = await page(rescored="true")
        assert sorted(x["id"] for x in rescored["results"]) == sorted(new)
        assert all(x["rescored_from"] in ids for x in rescored["results"])
        assert rescored["next"] == last  # the cursor moves past what was left out
        # a page of only left-out results still moves the cursor (no stall)
        tail = await page(rescored="false", after=originals["next"])
        assert tail["results"] == [] and tail["next"] == last
        r = await client.get("/v1/results", params={"rescored": "maybe"})
        assert r.status_code == 422 and "rescored" in r.text

        sdk = AsyncClient(
            "http://rollserve", transport=httpx.ASGITransport(app=create_app(service, manage_lifecycle=False))
        )
        streamed = [x.id async for x in sdk.stream_results(wait=1, until=2)]
        assert sorted(streamed) == sorted(ids)
        streamed = [x.id async for x in sdk.stream_results(wait=1, until=2, rescored=True)]
        assert sorted(streamed) == sorted(new)
        streamed = [x.id async for x in sdk.stream_results(wait=1, until=4, rescored=None)]
        assert sorted(streamed) == sorted(ids + new)
        await sdk.aclose()
