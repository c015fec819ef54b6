"""A harness's gateway calls are its rollout's work on the server's loop
(``engine.priority``), by either path: the TCP route (``/v1/gateway/<key>/...``, marked by
``HarnessRoutes``) and a sandbox's unix socket (served in the context of the rollout that
opened it); the trainer's routes stay ahead of them. Each route is replaced by one that
notes the mark it runs under."""

from __future__ import annotations

import asyncio

import aiohttp
import httpx
import pytest
from aiohttp import web
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from rollserve.agent.gateway.unix_socket import SOCKET_NAME, SessionSocket
from rollserve.api.routes_gateway import HARNESS_ROUTES, HarnessRoutes
from rollserve.engine.priority import background_context, in_background
from tests.engine.test_priority import LOOPS


@pytest.mark.parametrize("make", LOOPS)
def test_the_tcp_gateway_route_is_background_and_the_trainers_routes_are_not(monkeypatch, make):
    seen: dict[str, bool] = {}

    async def models(key: str, request: object) -> Response:
        seen["gateway"] = in_background()
        return Response(b"{}", media_type="application/json")

    async def trainer_app(scope: Scope, receive: Receive, send: Send) -> None:
        seen[scope["path"]] = in_background()
        await Response(b"{}", media_type="application/json")(scope, receive, send)

    monkeypatch.setitem(HARNESS_ROUTES, ("GET", "v1/models"), models)
    routes = HarnessRoutes(trainer_app)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await asyncio.create_task(routes(scope, receive, send))  # a task a request, as uvicorn runs them

    async def main() -> list[int]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://rollserve") as client:
            codes = []
            for path in ("/v1/gateway/rsg-k/v1/models", "/v1/status", "/v1/gateway/rsg-k/v1/nothing"):
                codes.append((await client.get(path)).status_code)
            return codes

    with asyncio.Runner(loop_factory=make) as runner:
        assert runner.run(main()) == [200, 200, 200]
    # (a gateway path no route takes goes on to the app, still as the harness's call)
    assert seen == {"gateway": True, "/v1/status": False, "/v1/gateway/rsg-k/v1/nothing": True}


@pytest.mark.parametrize("make", LOOPS)
def test_a_sandbox_gateway_socket_opened_by_a_rollout_serves_in_the_background(monkeypatch, tmp_path, make):
    seen: list[bool] = []

    async def models(self: SessionSocket, request: web.Request) -> web.Response:
        seen.append(in_background())
        return web.json_response({"data": []})

    monkeypatch.setattr(SessionSocket, "_models", models)

    async def main() -> int:
        socket = SessionSocket(session=None, folder=tmp_path)  # type: ignore[arg-type]  # (no route here uses it)
        await asyncio.create_task(socket.start(), context=background_context())  # as a rollout's INIT does
        try:
            connector = aiohttp.UnixConnector(path=str(tmp_path / SOCKET_NAME))
            async with aiohttp.ClientSession(connector=connector) as client:  # the harness, from outside
                async with client.get("http://sandbox/v1/models") as answer:
                    return answer.status
        finally:
            await socket.close()

    with asyncio.Runner(loop_factory=make) as runner:
        assert runner.run(main()) == 200
    assert seen == [True]
