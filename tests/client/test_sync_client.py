"""The blocking client over real HTTP: a uvicorn server on a loopback port (in this
test's event loop), the client in a worker thread, every answer a contract model."""

from __future__ import annotations

import asyncio
import socket

import uvicorn

from rollserve.api.app import create_app
from rollserve.client import Client, RollserveError
from rollserve.contract import (
    GroupView,
    RolloutResult,
    SamplingParams,
    ServiceStatus,
    TaskRequest,
)
from tests.waiting import eventually

MATH = {"question": "What is 2 + 2?", "answer": "4"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _trainer(url: str) -> tuple[GroupView, list[RolloutResult], ServiceStatus, RollserveError]:
    """What a script does with the blocking client."""
    with Client(url, timeout=30) as client:
        task = TaskRequest(data_source="math", instance=MATH, n=2)
        (group,) = client.submit([task], sampling=SamplingParams(max_tokens=32)).groups
        view = client.wait_group(group.group_id, timeout=60)
        streamed = list(client.stream_results(after=0, until=2, wait=5))
        status = client.status()
        try:
            client.rollout("nope")
        except RollserveError as exc:
            missing = exc
        else:
            raise AssertionError("an unknown rollout was found")
    return view, streamed, status, missing


async def test_the_sync_client_answers_contract_models(make_api, fake_llm):
    service, _ = await make_api([fake_llm.url])
    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(service, manage_lifecycle=False), host="127.0.0.1", port=port, log_level="warning")
    )
    serving = asyncio.create_task(server.serve())
    try:
        await eventually(lambda: server.started, timeout=30, what="the server to start")
        view, streamed, status, missing = await asyncio.wait_for(
            asyncio.to_thread(_trainer, f"http://127.0.0.1:{port}"), 120
        )
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 30)
    assert isinstance(view, GroupView) and view.done and view.status_counts == {"completed": 2}
    assert all(isinstance(r, RolloutResult) for r in streamed)
    assert sorted(r.id for r in streamed) == sorted(m.id for m in view.rollouts)
    assert [r.reward for r in streamed] == [1.0, 1.0] and sorted(r.seq for r in streamed) == [1, 2]
    assert [m.result for m in view.rollouts] == sorted(streamed, key=lambda r: r.id)
    assert isinstance(status, ServiceStatus) and status.finished == {"completed": 2}
    assert missing.status == 404 and "nope" in str(missing.detail)
