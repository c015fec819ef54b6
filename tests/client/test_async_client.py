import asyncio
import subprocess
import sys

import httpx
import pytest

from rollserve.api.app import create_app
from rollserve.client import AsyncClient, RollserveError
from rollserve.contract import RolloutResult, SamplingParams, TaskRequest

MATH = {"data_source": "math", "instance": {"question": "What is 2 + 2?", "answer": "4"}}


def client_for(service, token=None) -> AsyncClient:
    app = create_app(service, manage_lifecycle=False)
    return AsyncClient("http://rollserve", token=token, transport=httpx.ASGITransport(app=app))


async def test_submit_wait_stream_and_cancel(make_api, fake_llm):
    service, _ = await make_api([fake_llm.url])
    async with client_for(service) as client:
        accepted = await client.submit([{**MATH, "n": 3}], sampling={"max_tokens": 32})
        (group,) = accepted.groups
        view = await client.wait_group(group.group_id, timeout=30)
        assert view.done and len(view.rollouts) == 3
        streamed = [r async for r in client.stream_results(after=0, until=3, wait=5)]
        assert all(isinstance(r, RolloutResult) for r in streamed)
        assert sorted(r.id for r in streamed) == sorted(group.rollout_ids)
        assert sorted(r.seq for r in streamed) == [1, 2, 3]
        assert (await client.rollout(group.rollout_ids[0])).done
        assert (await client.status()).finished == {"completed": 3}
        with pytest.raises(RollserveError) as info:
            await client.submit([{**MATH, "n": 0}])
        assert info.value.status == 422 and "tasks[0].n" in str(info.value.detail)


async def test_an_oversampled_group_through_the_client(make_api, fake_llm):
    """The client's models carry the new task fields and the group's verdict."""
    service, _ = await make_api([fake_llm.url])
    async with client_for(service) as client:
        task = TaskRequest.model_validate({**MATH, "n": 2, "oversample": 2, "filter_zero_variance": True})
        accepted = await client.submit([task], sampling=SamplingParams(max_tokens=32))
        (group,) = accepted.groups
        assert len(group.rollout_ids) == 4
        view = await client.wait_group(group.group_id, timeout=60)
        # Every sample answers right: the used rewards agree, so the filter flags it.
        assert view.done and view.usable is False and view.reasons == ["zero_variance"]
        assert view.counts.started == 4 and view.counts.used == 2 and view.counts.filtered == 2
        used = view.used_results()
        assert len(used) == 2 and all(not r.mask and r.reward == 1.0 for r in used)
        assert (await client.status()).groups.groups_filtered == 1


async def test_a_429_is_retried_until_there_is_room(make_api):
    service, _ = await make_api(max_pending=1)  # no backend: the first rollout waits
    async with client_for(service) as client:
        first = await client.submit([MATH])
        blocker = first.groups[0].rollout_ids[0]

        async def free_room_later():
            await asyncio.sleep(0.3)
            await client.cancel(blocker)

        freeing = asyncio.create_task(free_room_later())
        second = await client.submit([MATH])  # 429 first, then accepted after the cancel
        await freeing
        assert second.groups[0].rollout_ids


async def test_token_is_sent(make_api):
    service, _ = await make_api(token="tok-1")
    async with client_for(service, token="tok-1") as client:
        assert set((await client.status()).stages) == {"init", "run", "eval"}
    async with client_for(service, token="wrong") as client:
        with pytest.raises(RollserveError) as info:
            await client.status()
        assert info.value.status == 401


async def test_typed_requests_go_as_set_and_the_batch_settings_stay_under_them(make_api, fake_llm):
    """A TaskRequest's unset sampling fields leave the batch's in force: the client sends
    what was set, as a dict would."""
    service, _ = await make_api([fake_llm.url])
    async with client_for(service) as client:
        task = TaskRequest(data_source="math", instance=MATH["instance"], n=1, sampling=SamplingParams(temperature=0.5))
        answer = await client.run(task, sampling=SamplingParams(max_tokens=48), wait=30)
        (result,) = answer.results
        assert result.status == "completed" and result.reward == 1.0
        (call,) = fake_llm.calls
        assert call.request["temperature"] == 0.5 and call.request["max_tokens"] == 48
        again = await client.run({**MATH, "sampling": {"temperature": 0.5}}, sampling={"max_tokens": 48}, wait=30)
        assert again.results[0].status == "completed"
        second = fake_llm.calls[1].request  # the same settings either way
        assert (second["temperature"], second["max_tokens"]) == (0.5, call.request["max_tokens"])


def test_the_client_imports_nothing_of_the_server():
    """A trainer can install the client alone: it needs rollserve.contract (pydantic)
    and the neutral datasets package, never the server's layers."""
    code = (
        "import sys, rollserve.client, rollserve.client.run_dataset, rollserve.contract\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('rollserve'))))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout.split()
    assert loaded, "nothing was imported"
    server_side = [m for m in loaded if m.split(".")[1:2] and m.split(".")[1] not in ("client", "contract", "datasets")]
    assert server_side == [], server_side
