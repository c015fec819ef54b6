import asyncio

import httpx
import pytest

from rollserve.api.app import create_app
from rollserve.client import AsyncClient, RollserveError

MATH = {"data_source": "math", "instance": {"question": "What is 2 + 2?", "answer": "4"}}


def client_for(service, token=None) -> AsyncClient:
    app = create_app(service, manage_lifecycle=False)
    return AsyncClient("http://rollserve", token=token,
                       transport=httpx.ASGITransport(app=app))


async def test_submit_wait_stream_and_cancel(make_api, fake_llm):
    service, _ = await make_api([fake_llm.url])
    async with client_for(service) as client:
        accepted = await client.submit([{**MATH, "n": 3}], sampling={"max_tokens": 32})
        group = accepted["groups"][0]
        view = await client.wait_group(group["group_id"], timeout=30)
        assert view["done"] and len(view["rollouts"]) == 3
        streamed = [r async for r in client.stream_results(after=0, until=3, wait=5)]
        assert sorted(r["id"] for r in streamed) == sorted(group["rollout_ids"])
        assert (await client.rollout(group["rollout_ids"][0]))["done"]
        assert (await client.status())["finished"] == {"completed": 3}
        with pytest.raises(RollserveError) as info:
            await client.submit([{**MATH, "n": 0}])
        assert info.value.status == 422 and "tasks[0].n" in str(info.value.detail)


async def test_a_429_is_retried_until_there_is_room(make_api):
    service, _ = await make_api(max_pending=1)  # no backend: the first rollout waits
    async with client_for(service) as client:
        first = await client.submit([MATH])
        blocker = first["groups"][0]["rollout_ids"][0]

        async def free_room_later():
            await asyncio.sleep(0.3)
            await client.cancel(blocker)

        freeing = asyncio.create_task(free_room_later())
        second = await client.submit([MATH])  # 429 first, then accepted after the cancel
        await freeing
        assert second["groups"][0]["rollout_ids"]


async def test_token_is_sent(make_api):
    service, _ = await make_api(token="tok-1")
    async with client_for(service, token="tok-1") as client:
        assert "stages" in await client.status()
    async with client_for(service, token="wrong") as client:
        with pytest.raises(RollserveError) as info:
            await client.status()
        assert info.value.status == 401
