"""The lean HTTP/1.1 path (``llm.backends.http1``) of ``HTTPClient``'s JSON calls to a
plain-http server, against a scripted raw server: connections kept alive and reused,
every way a response can end (length, chunked, the connection's close), and the ways a
server or the caller can break an exchange, each a typed ``LLMError`` and never a late
answer read as the next request's."""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import Awaitable, Callable

import pytest

from rollserve.errors import LLMError
from rollserve.llm.backends.http import HTTPClient
from rollserve.llm.backends.http1 import Connections
from tests.waiting import eventually

Handler = Callable[[int, dict, bytes, asyncio.StreamWriter], Awaitable[None]]


class RawServer:
    """An HTTP server written out by hand: ``handler(n, headers, body, writer)`` answers
    the ``n``-th request (counted across connections) with whatever bytes it writes."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[tuple[str, dict, bytes, int]] = []  # (request line, headers, body, connection)
        self.connections = 0
        self._server: asyncio.Server | None = None
        self.url = ""

    async def __aenter__(self) -> RawServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        conn = self.connections
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                line, *rest = head.decode("latin-1").split("\r\n")
                headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in rest if h)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                self.requests.append((line, headers, body, conn))
                await self.handler(len(self.requests), headers, body, writer)
                if writer.is_closing():
                    return
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # (cancelled: the test's loop is closing; this connection ends with it)
        finally:
            writer.close()


def reply(body: bytes, status: str = "200 OK", extra: str = "") -> bytes:
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode()
        + body
    )


async def echo(n: int, headers: dict, body: bytes, writer: asyncio.StreamWriter) -> None:
    writer.write(reply(json.dumps({"n": n, "got": json.loads(body or b"null")}).encode()))


async def test_json_calls_reuse_one_kept_alive_connection_and_send_what_aiohttp_sent():
    async with RawServer(echo) as server:
        client = HTTPClient(server.url + "/prefix", "raw", api_key="secret")
        try:
            body = {"prompt": [1, 2, 3], "text": "caf\u00e9 \U0001f600"}
            assert await client.request_json("POST", "/v1/completions", body) == {"n": 1, "got": body}
            assert await client.request_json("POST", "/v1/completions", body) == {"n": 2, "got": body}
            assert await client.request_json("POST", "/pause", params={"mode": "wait"}) == {"n": 3, "got": None}
            wire = client.connections()
            assert wire is not None and wire.open_connections == 1 and wire.idle_connections == 1
        finally:
            await client.close()
    assert server.connections == 1 and {r[3] for r in server.requests} == {1}
    line, headers, _, _ = server.requests[0]
    assert line == "POST /prefix/v1/completions HTTP/1.1"
    assert headers["authorization"] == "Bearer secret" and headers["host"] == server.url.removeprefix("http://")
    assert headers["content-type"] == "application/json" and headers["accept-encoding"] == "identity"
    assert server.requests[2][0] == "POST /prefix/pause?mode=wait HTTP/1.1"
    assert server.requests[2][1]["content-length"] == "0"


async def test_chunked_gzip_and_until_close_bodies_are_read_whole():
    payload = json.dumps({"ids": list(range(300))}).encode()

    async def varied(n: int, headers: dict, body: bytes, writer: asyncio.StreamWriter) -> None:
        if n == 1:  # chunked, in pieces
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for i in range(0, len(payload), 100):
                piece = payload[i : i + 100]
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                await writer.drain()
            writer.write(b"0\r\n\r\n")
        elif n == 2:  # compressed although identity was asked for
            packed = gzip.compress(payload)
            writer.write(
                f"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: {len(packed)}\r\n\r\n".encode() + packed
            )
        else:  # HTTP/1.0 style: no length, the body ends with the connection
            writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: application/json; charset=latin-1\r\n\r\n" + payload)
            await writer.drain()
            writer.close()

    async with RawServer(varied) as server:
        client = HTTPClient(server.url, "raw")
        try:
            for _ in range(3):
                assert await client.request_json("POST", "/x", {"a": 1}) == {"ids": list(range(300))}
            assert server.connections == 1  # the first two kept the connection alive
            assert await client.request_json("POST", "/x", {"a": 1}) == {"ids": list(range(300))}
            assert server.connections == 2  # the third's ended with it: a new one
        finally:
            await client.close()


async def test_a_timed_out_or_cancelled_request_never_leaves_its_late_answer_for_the_next():
    """An answer that comes after the caller gave up (its timeout, or its task cancelled)
    is never read: that connection is closed, so the next request, on another, gets its
    own answer."""
    release = asyncio.Event()

    async def hold(n: int, headers: dict, body: bytes, writer: asyncio.StreamWriter) -> None:
        if json.loads(body)["hold"]:
            await release.wait()
        writer.write(reply(json.dumps({"n": n}).encode()))

    async with RawServer(hold) as server:
        client = HTTPClient(server.url, "raw")
        try:
            with pytest.raises(LLMError, match="timed out") as info:
                await client.request_json("POST", "/x", {"hold": True}, timeout=0.2)
            assert info.value.retryable
            assert await client.request_json("POST", "/x", {"hold": False}) == {"n": 2}
            held = asyncio.ensure_future(client.request_json("POST", "/x", {"hold": True}))
            await eventually(lambda: len(server.requests) == 3)
            held.cancel()
            with pytest.raises(asyncio.CancelledError):
                await held
            release.set()
            assert await client.request_json("POST", "/x", {"hold": False}) == {"n": 4}
            wire = client.connections()
            assert wire is not None and wire.open_connections == 1
        finally:
            await client.close()
    assert server.connections == 3 and [r[3] for r in server.requests] == [1, 2, 2, 3]


async def test_a_broken_exchange_is_a_typed_retryable_error_and_the_next_call_works():
    async def breaking(n: int, headers: dict, body: bytes, writer: asyncio.StreamWriter) -> None:
        if n == 1:  # half an answer, then the connection ends
            writer.write(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"partial')
            await writer.drain()
            writer.close()
        elif n == 2:  # not HTTP
            writer.write(b"SMTP ready\r\n\r\n")
        elif n == 3:
            writer.write(reply(b'{"error": "overloaded"}', status="503 Service Unavailable"))
        else:
            writer.write(reply(b'{"ok": true}'))

    async with RawServer(breaking) as server:
        client = HTTPClient(server.url, "raw")
        try:
            with pytest.raises(LLMError, match="ServerDisconnected") as info:
                await client.request_json("POST", "/x", {})
            assert info.value.retryable
            with pytest.raises(LLMError, match="ClientPayloadError") as info:
                await client.request_json("POST", "/x", {})
            assert info.value.retryable
            with pytest.raises(LLMError, match="HTTP 503.*overloaded") as info:
                await client.request_json("POST", "/x", {})
            assert info.value.status == 503 and info.value.retryable
            assert await client.request_json("POST", "/x", {}) == {"ok": True}
        finally:
            await client.close()


async def test_a_connection_the_server_closed_while_idle_is_not_used_again():
    async def close_after(n: int, headers: dict, body: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(reply(json.dumps({"n": n}).encode()))  # kept alive, as far as the headers say
        await writer.drain()
        writer.close()

    async with RawServer(close_after) as server:
        client = HTTPClient(server.url, "raw")
        try:
            assert await client.request_json("GET", "/x") == {"n": 1}
            wire = client.connections()
            assert wire is not None
            await eventually(lambda: wire.open_connections == 0, what="the server's close noticed")
            assert await client.request_json("GET", "/x") == {"n": 2}
        finally:
            await client.close()
    assert server.connections == 2


async def test_no_server_is_a_retryable_connect_error_and_other_urls_keep_aiohttp():
    client = HTTPClient("http://127.0.0.1:1", "nobody")
    try:
        with pytest.raises(LLMError, match="ClientConnectorError") as info:
            await client.request_json("POST", "/x", {})
        assert info.value.retryable
    finally:
        await client.close()
    assert not Connections.usable("https://host:1") and not Connections.usable("http://user:pw@host:1")
    assert Connections.usable("http://[::1]:8000/v1")
    keeps = HTTPClient("http://user:pw@127.0.0.1:1", "creds")
    assert keeps.connections() is None
    await keeps.close()


async def test_idle_connections_past_the_keepalive_are_closed_not_reused():
    async with RawServer(echo) as server:
        wire = Connections(server.url, connect_timeout=5, keepalive=0.0)
        try:
            assert (await wire.request("GET", "/x", {}))[0] == 200
            assert wire.idle_connections == 1
            assert (await wire.request("GET", "/x", {}))[0] == 200  # the idle one was too old
        finally:
            wire.close()
    assert server.connections == 2
