"""A gateway rollout's session is freed when the rollout ends: through the HTTP API,
harnesses in bubblewrap sandboxes call their session's socket on every route (one with
another rollout's key, one on a route that does not exist), and once their rollouts are
done no session, socket app or trajectory of theirs is left in memory.

The soak found it (``benchmarks/soak.py``: the server's RSS rose ~34 MB an hour): the
socket's app ran a middleware, and aiohttp keeps each (handler, app) pair that runs
middlewares in a module-wide cache of 1,024, so the last 1,024 sessions stayed alive
after their rollouts, each with its whole trajectory."""

from __future__ import annotations

import asyncio
import gc

import pytest
from aiohttp import web_app

from rollserve.agent.gateway.session import GatewaySession
from rollserve.agent.gateway.unix_socket import SessionSocket
from rollserve.agent.trajectory import Trajectory
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from rollserve.testing import FakeVLLM
from tests.e2e.test_gateway_api import policy, result

pytestmark = pytest.mark.skipif(
    BubblewrapRuntime.unavailable_reason() is not None,
    reason=f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}",
)

# Every route of the socket, then a call with a made-up gateway key and one to a route
# that does not exist: the refusals run the key check too.
HARNESS = """
import json, os, urllib.error, urllib.request

base = os.environ["OPENAI_BASE_URL"]
root = base.removesuffix("/v1")


def call(path, body=None, key=os.environ["OPENAI_API_KEY"], method=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(root + path, data=data, method=method, headers={
        "Content-Type": "application/json", "Authorization": "Bearer " + key, "x-api-key": key,
        "anthropic-version": "2023-06-01"})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status
    except urllib.error.HTTPError as refused:
        return refused.code


chat = {"model": "p", "messages": [{"role": "user", "content": "[script:boxed] go"}], "max_tokens": 16}
codes = [call("/v1/models"), call("/v1/chat/completions", chat),
         call("/v1/messages/count_tokens", {"model": "p", "messages": [{"role": "user", "content": "hi"}]}),
         call("/v1/chat/completions", chat, key="rsg-not-this-sessions-key"),
         call("/v1/nothing-here", method="GET")]
print("codes:", codes)
"""


def alive(kind: type) -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is kind)


@pytest.fixture
async def llm():
    async with FakeVLLM("smollm2", replies=policy, latency=0.0) as server:
        yield server


async def test_ended_gateway_rollouts_leave_no_session_socket_or_trajectory_behind(make_api, llm):
    service, client = await make_api([llm.url])
    before = {kind: alive(kind) for kind in (GatewaySession, SessionSocket, Trajectory)}
    cached = web_app._cached_build_middleware.cache_info().currsize
    task = {
        "data_source": "gateway",
        "instance": {"answer": "reply 0 of boxed", "files": {"h.py": HARNESS}, "command": '"$ROLLSERVE_PYTHON" h.py'},
    }
    r = await client.post(
        "/v1/rollouts", json={"tasks": [task] * 4, "sampling": {"max_tokens": 16}, "agent": {"max_turns": 4}}
    )
    assert r.status_code == 202, r.text
    ids = [rid for group in r.json()["groups"] for rid in group["rollout_ids"]]
    done = await asyncio.gather(*(result(client, rid) for rid in ids))
    for one in done:
        assert one["status"] == "completed", one["failure"]
        assert "codes: [200, 200, 200, 401, 404]" in one["evaluation"]["harness_log_tail"]
    assert service.sandboxes.open_sandboxes() == []
    # Nothing of the four sessions is left: not the session, not its socket's app, not
    # the trajectory it recorded; and aiohttp's middleware cache holds none of them.
    # (Not more than before: one an earlier test left may be freed meanwhile.)
    after = {kind: alive(kind) for kind in (GatewaySession, SessionSocket, Trajectory)}
    assert all(after[kind] <= before[kind] for kind in before), (before, after)
    assert web_app._cached_build_middleware.cache_info().currsize == cached
