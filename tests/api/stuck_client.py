"""An ASGI client whose socket buffers are full: it reads the response's start, then
nothing more, and never disconnects. The server's next send never returns, so a stream
must end by its own send timeout (the status stream, ``/v1/events``)."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import ASGIApp, Message


def scope(path: str, query: bytes = b"", token: str | None = None) -> dict[str, Any]:
    headers = [(b"host", b"rollserve")]
    if token is not None:
        headers.append((b"authorization", f"Bearer {token}".encode()))
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": query,
        "headers": headers,
        "client": ("127.0.0.1", 5000),
        "server": ("rollserve", 80),
    }


def serve_stuck(app: ASGIApp, request_scope: dict[str, Any]) -> tuple[asyncio.Task, asyncio.Event]:
    """The app serving ``request_scope`` to a stuck client (the task), and an event set
    when the response started."""
    started = asyncio.Event()
    never = asyncio.Event()

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            started.set()
            return
        await never.wait()  # the client reads nothing more

    async def receive() -> Message:
        await never.wait()  # and never disconnects either
        return {"type": "http.disconnect"}

    return asyncio.create_task(app(request_scope, receive, send)), started
