"""What the LLM client's aiohttp configuration must keep doing: a backend that sets a
cookie never gets it back (the session keeps none), a gzip answer still decodes, a
call's own timeout still bounds it, and an error answer still names its status and
says whether the prompt did not fit."""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from rollserve.errors import ContextWindowError, LLMError
from rollserve.llm.backends.http import HTTPClient


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, list[web.Request]]]:
    seen: list[web.Request] = []
    release = asyncio.Event()  # set at teardown: the slow answer's handler ends

    async def login(request: web.Request) -> web.Response:
        seen.append(request)
        resp = web.json_response({"ok": True})
        resp.set_cookie("session", "stolen", path="/")
        return resp

    async def echo(request: web.Request) -> web.Response:
        seen.append(request)
        return web.json_response({"cookie": request.headers.get("Cookie"), "body": await request.json()})

    async def zipped(request: web.Request) -> web.Response:
        seen.append(request)
        body = gzip.compress(json.dumps({"token_ids": [1, 2, 3]}).encode())
        return web.Response(body=body, headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})

    async def slow(request: web.Request) -> web.Response:
        await release.wait()  # no answer before teardown: the client's timeout ends the call
        return web.Response(text="late")

    async def overflow(request: web.Request) -> web.Response:
        return web.json_response({"message": "This model's maximum context length is 8 tokens"}, status=400)

    async def busy(request: web.Request) -> web.Response:
        return web.Response(text="overloaded", status=503)

    async def latin(request: web.Request) -> web.Response:
        return web.Response(body="café".encode("latin-1"), content_type="text/plain", charset="latin-1")

    app = web.Application()
    app.router.add_get("/latin", latin)
    app.router.add_post("/login", login)
    app.router.add_post("/echo", echo)
    app.router.add_get("/zipped", zipped)
    app.router.add_get("/slow", slow)
    app.router.add_post("/overflow", overflow)
    app.router.add_post("/busy", busy)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", seen
    finally:
        release.set()
        await runner.cleanup()


@pytest.fixture
async def client(server) -> AsyncIterator[HTTPClient]:
    """The LLM client, as a backend configures it, to ``server``; closed after."""
    c = HTTPClient(server[0], "b")
    try:
        yield c
    finally:
        await c.close()


async def test_a_cookie_a_backend_sets_is_never_sent_back(client):
    assert await client.request_json("POST", "/login", {}, timeout=30) == {"ok": True}
    again = await client.request_json("POST", "/echo", {"x": 1}, timeout=30)
    assert again == {"cookie": None, "body": {"x": 1}}


async def test_the_cookie_would_come_back_with_aiohttps_default_jar(server):
    """The control: the double's cookie is one a default jar sends back (``unsafe``: a
    default jar takes cookies from host names only, and the double is at an IP)."""
    url, _ = server
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as session:
        async with session.post(url + "/login", json={}) as resp:
            assert resp.status == 200
        async with session.post(url + "/echo", json={"x": 1}) as resp:
            assert (await resp.json())["cookie"] == "session=stolen"


async def test_a_gzip_answer_still_decodes(server, client):
    _, seen = server
    assert await client.request_json("GET", "/zipped", timeout=30) == {"token_ids": [1, 2, 3]}
    assert "gzip" in seen[0].headers.get("Accept-Encoding", "")


async def test_a_calls_own_timeout_bounds_it_each_time(client):
    for _ in range(2):  # and the connection's state after a timeout does not leak into the next call
        with pytest.raises(LLMError, match="timed out after 0.2 s") as caught:
            await client.request_json("GET", "/slow", timeout=0.2)
        assert caught.value.retryable


async def test_error_answers_keep_their_status_and_kind(client):
    with pytest.raises(ContextWindowError):
        await client.request_json("POST", "/overflow", {"prompt": [1]}, timeout=30)
    with pytest.raises(LLMError, match="answered HTTP 503: overloaded") as caught:
        await client.request_json("POST", "/busy", {}, timeout=30)
    assert caught.value.status == 503 and caught.value.retryable


async def test_text_answers_decode_in_their_charset_and_are_not_json(client):
    assert await client.request_text("GET", "/latin", timeout=30) == "café"
    with pytest.raises(LLMError, match="answered non-JSON: caf") as caught:
        await client.request_json("GET", "/latin", timeout=30)
    assert caught.value.status == 200 and not caught.value.retryable
