"""A session served on a unix socket, for a harness inside a sandbox.

The socket is bound in a folder the sandbox sees read-only and only the server writes
(``Sandbox.server_folder``, never the workspace: there any process of the sandbox
could unlink it and bind its own server at its path), and answers the gateway's
model routes (OpenAI's ``/v1/chat/completions``, ``/v1/responses`` and
``/v1/models``, Anthropic's ``/v1/messages`` and ``/v1/messages/count_tokens``) for ONE
session: whoever connects is that rollout's harness, so
no key is needed and none can name another rollout. Given the session's ``key``, a
request that carries another gateway key (``rsg-...`` as ``Authorization: Bearer`` or
``x-api-key``: another rollout's, leaked or guessed) is refused with a 401
``invalid_api_key``; other API keys are ignored. The sandbox has no network; its
``forwarder`` turns 127.0.0.1 inside into this socket. Each call is admitted
(``GatewaySession.admitted``) before its body is read, the body is read up to the
session's bound (``bounds.max_body_bytes``, a 413 past it) and parsed in a thread.
The socket is bound through
``/proc/self/fd/<folder>`` so a deep workspace path does not hit the 107-byte limit
of a unix socket's path.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterable
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Handler
from pydantic import BaseModel

from rollserve.agent.gateway import anthropic_wire, responses_wire, wire
from rollserve.agent.gateway.base import BodyTooLarge, GatewayRefusal, UnknownKey, UnknownRoute
from rollserve.agent.gateway.bounds import MAX_BODY, sized
from rollserve.agent.gateway.registry import KEY_PREFIX
from rollserve.agent.gateway.session import GatewayReply, GatewaySession

__all__ = ["SOCKET_NAME", "SessionSocket"]

SOCKET_NAME = ".rollserve-gateway.sock"


async def _answer(answer: GatewayReply, size: int, body: Callable[[], BaseModel]) -> web.Response:
    """A non-streamed answer's body, made and rendered where its size says (``sized``;
    ``size``: the request's bytes)."""
    rendered = await sized(wire.answer_size(answer, size), lambda: body().model_dump_json().encode("utf-8"))
    return web.Response(body=rendered, content_type="application/json")


async def _stream(answer: GatewayReply, size: int, events: Callable[[], Iterable[bytes]]) -> web.Response:
    """A streamed answer's events, made where their size says (``sized``)."""
    made = await sized(wire.answer_size(answer, size), lambda: b"".join(events()))
    return web.Response(body=made, content_type="text/event-stream", headers={"Cache-Control": "no-cache"})


class SessionSocket:
    """``session``'s model routes on a unix socket in ``folder`` (``start``/``close``)."""

    def __init__(self, session: GatewaySession, folder: Path, name: str = SOCKET_NAME, key: str | None = None) -> None:
        self.session = session
        self.folder = folder
        self.name = name
        self.key = key
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        # No middleware: aiohttp keeps each (handler, app) pair that runs middlewares in
        # a module-wide cache of 1,024 (``web_app._cached_build_middleware``), made for
        # an app that lives as long as the process. An app per session there kept the
        # last 1,024 sessions alive after their rollouts ended, each with its whole
        # trajectory. Every route checks the key itself (``_own_key_only``).
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_post("/v1/chat/completions", self._own_key_only(self._chat))
        app.router.add_post("/v1/messages", self._own_key_only(self._messages))
        app.router.add_post("/v1/responses", self._own_key_only(self._responses))
        app.router.add_get("/v1/models", self._own_key_only(self._models))
        app.router.add_post("/v1/messages/count_tokens", self._own_key_only(self._count_tokens))
        app.router.add_route("*", "/{tail:.*}", self._own_key_only(self._unknown))
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        folder = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            path = f"/proc/self/fd/{folder}/{self.name}"
            sock.bind(path)
            os.chmod(path, 0o666)  # the sandbox runs as a uid of its own
        except OSError:
            sock.close()
            await runner.cleanup()
            raise
        finally:
            os.close(folder)
        sock.listen(64)
        self._runner = runner
        await web.SockSite(runner, sock).start()

    async def close(self) -> None:
        """Stop answering (idempotent); the socket file goes with the sandbox."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    def _own_key_only(self, handler: Handler) -> Handler:
        """``handler``, refusing a request that names another gateway key than this
        session's."""

        async def checked(request: web.Request) -> web.StreamResponse:
            bearer = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
            for sent in (bearer, request.headers.get("x-api-key", "").strip()):
                if self.key is not None and sent.startswith(KEY_PREFIX) and sent != self.key:
                    return _refused(UnknownKey("this gateway key is not this sandbox's session's"))
            return await handler(request)

        return checked

    async def _body(self, request: web.Request) -> bytes:
        """The body, never more than the session's bound of it read (a 413 past it)."""
        limit = self.session.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise _too_large(limit)
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.content.iter_any():
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            chunks.append(chunk)
        return b"".join(chunks)

    async def _chat(self, request: web.Request) -> web.Response:
        try:
            with self.session.admitted():  # before the body is read (429 past the bound)
                raw = await self._body(request)  # (parsed in a thread past INLINE_BYTES)
                parsed = await sized(len(raw), wire.parse_request, raw)
                answer = await self.session.complete(parsed, size=len(raw))
        except GatewayRefusal as refusal:
            return _refused(refusal)
        if parsed.stream:
            return await _stream(answer, len(raw), lambda: wire.stream_chunks(answer, parsed))
        return await _answer(answer, len(raw), lambda: wire.completion(answer, parsed.model))

    async def _messages(self, request: web.Request) -> web.Response:
        try:
            with self.session.admitted():
                raw = await self._body(request)
                parsed, chat = await sized(len(raw), anthropic_wire.parse_request, raw)
                answer = await self.session.complete(chat, anthropic_wire.CALL_IDS, len(raw))
        except GatewayRefusal as refusal:
            return _refused(refusal, anthropic_wire.error_body(refusal))
        if parsed.stream:
            return await _stream(answer, len(raw), lambda: anthropic_wire.events(answer, parsed.model))
        return await _answer(answer, len(raw), lambda: anthropic_wire.message(answer, parsed.model))

    async def _responses(self, request: web.Request) -> web.Response:
        try:
            with self.session.admitted():
                raw = await self._body(request)
                parsed, chat = await sized(len(raw), responses_wire.parse_request, raw)
                answer = await self.session.complete(chat, responses_wire.CALL_IDS, len(raw))
        except GatewayRefusal as refusal:
            return _refused(refusal)
        if parsed.stream:
            return await _stream(answer, len(raw), lambda: responses_wire.events(answer, parsed))
        return await _answer(answer, len(raw), lambda: responses_wire.response(answer, parsed))

    async def _models(self, request: web.Request) -> web.Response:
        return web.Response(
            body=responses_wire.models().model_dump_json().encode("utf-8"), content_type="application/json"
        )

    async def _count_tokens(self, request: web.Request) -> web.Response:
        try:
            with self.session.admitted():
                raw = await self._body(request)
                _, chat = await sized(len(raw), anthropic_wire.parse_count_request, raw)
                tokens = await self.session.count_tokens(chat, len(raw))
        except GatewayRefusal as refusal:
            return _refused(refusal, anthropic_wire.error_body(refusal))
        return web.Response(body=anthropic_wire.count_body(tokens), content_type="application/json")

    async def _unknown(self, request: web.Request) -> web.Response:
        return _refused(
            UnknownRoute(
                f"no route {request.method} {request.path}: the gateway "
                "answers POST /v1/chat/completions, POST /v1/responses, "
                "GET /v1/models, POST /v1/messages and "
                "POST /v1/messages/count_tokens"
            )
        )


def _refused(refusal: GatewayRefusal, body: bytes | None = None) -> web.Response:
    """``refusal`` with the status ``wire.ERRORS`` gives it; ``body`` (OpenAI's shape
    unless given)."""
    return web.Response(
        body=wire.error_body(refusal) if body is None else body,
        status=wire.status(refusal),
        content_type="application/json",
    )


def _too_large(limit: int) -> BodyTooLarge:
    return BodyTooLarge(
        f"the request body is larger than this session's limit of {limit} bytes (from its context window)"
    )
