"""The one HTTP client stack every server backend uses (aiohttp).

aiohttp rather than httpx: one ``ClientSession`` holds 10,000+ requests in flight at
a small cost per request (NeMo Gym left httpx for aiohttp at 16k for the same reason).

The connection pool is bounded: at most ``max_connections`` sampling requests are
sent to one server at once (``sampling_slot``); more wait, in order, for one to
finish. The wait is not the server's: a request's own timeout starts once it is
sent, the router's ``attempt_timeout`` once it holds its slot (``llm.base.SlotWait``),
and the caller's deadline (the rollout's) bounds the wait. 65,000 rollouts in
flight so hold ``max_connections`` sockets per backend, not 65,000. Control calls and
health checks do not wait behind sampling: the connector keeps ``CONTROL_CONNECTIONS``
more for them.

Failures come back as ``LLMError`` with the HTTP status, the backend's name and
whether another try may succeed:

- connection refused/reset, server disconnected, a timeout of our own, 5xx, 408
  and 429: retryable (the router tries again, on another backend if it can);
- any other status, a reply that is not JSON: not retryable;
- a 400 that says the prompt does not fit the model's context (vLLM's "This model's
  maximum context length is N tokens...", "... longer than the maximum model length
  ...", SGLang's "... longer than the model's context length ..." and "Requested
  token count exceeds the model's maximum context length ...", llama.cpp's
  ``exceed_context_size_error``): ``ContextWindowError``, the agent's context
  exhausted rather than a broken backend.

A session belongs to the event loop it was made on, so one is made lazily per loop
(a backend may outlive a loop, e.g. across ``asyncio.run`` calls or tests).

The session keeps no cookies (``DummyCookieJar``: a backend that sets one never gets
it back, and no call filters a jar), and a JSON answer is parsed from its bytes (JSON
is UTF-8) rather than decoded to text first; only an error answer is decoded and read
for the context-overflow phrases. ``benchmarks/llm_client.py`` measures the CPU per
call against main's tree.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from rollserve.errors import ContextWindowError, LLMError
from rollserve.llm.base import SLOT_WAIT
from rollserve.llm.slots import FifoSlots

MAX_CONNECTIONS = 1024  # sampling requests in flight to one server, by default
CONTROL_CONNECTIONS = 32  # more connections for health checks and control calls
_BODY_EXCERPT = 300  # characters of an error body worth putting in a message
RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
# How inference servers word a prompt that does not fit (lowercased, in a 400's body).
CONTEXT_OVERFLOW = (
    "maximum context length",  # vLLM (every version), SGLang, OpenAI
    "context length",  # SGLang: "is longer than the model's context length"
    "maximum model length",  # vLLM's engine: "is longer than the maximum model length"
    "max_model_len",
    "context size",  # llama.cpp: "exceeds the available context size"
    "exceed_context_size_error",  # llama.cpp's error type
    "context_length_exceeded",  # OpenAI's error code
    # vLLM 0.32 cuts max_tokens to the room left; a prompt that fills the window
    # leaves 0, refused so (we never send max_tokens 0).
    "max_tokens must be at least 1, got 0",
)


def context_overflow(status: int, body: str) -> bool:
    """Whether an error answer says the prompt does not fit the model's context."""
    text = body.lower()
    return status == 400 and any(phrase in text for phrase in CONTEXT_OVERFLOW)


def check_base_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"url: expected http(s)://host:port, got {url!r}")
    return url.rstrip("/")


def host_port(url: str) -> str:
    """``host:port`` of ``url`` without any ``user:password@`` (a backend's default name
    is a metric label and shows on the dashboard: credentials never go there)."""
    return urlsplit(url).netloc.rpartition("@")[2]


def excerpt(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= _BODY_EXCERPT else text[:_BODY_EXCERPT] + "..."


def _text(raw: bytes) -> str:
    """An answer's bytes as text for a message (what is not UTF-8 replaced)."""
    return raw.decode("utf-8", "replace")


class HTTPClient:
    """JSON over HTTP to one server, with typed failures.

    ``max_connections=None``: no bound and no sampling slots (a client whose calls are
    not sampling, e.g. a tokenizer's: its requests never wait inside aiohttp, where
    the wait would count against their own timeout)."""

    def __init__(
        self,
        base_url: str,
        name: str,
        api_key: str | None = None,
        timeout: float | None = 600.0,
        connect_timeout: float = 10.0,
        max_connections: int | None = MAX_CONNECTIONS,
    ):
        if max_connections is not None and max_connections < 1:
            raise ValueError(f"max_connections: expected at least 1, got {max_connections}")
        self.base_url = check_base_url(base_url)
        self.name = name
        self.timeout = timeout
        self.max_connections = max_connections
        self.waiting = 0  # sampling requests waiting for a connection
        self._slots: FifoSlots | None = None
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client_timeout = aiohttp.ClientTimeout(total=timeout, sock_connect=connect_timeout)
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._loop is not loop:
            self._loop = loop
            bound = self.max_connections
            # (a queue of futures is per loop) FIFO, and a stop that cancels thousands of
            # waiters at once costs O(1) each (``llm.slots``)
            self._slots = FifoSlots(bound) if bound else None
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=bound + CONTROL_CONNECTIONS if bound else 0, limit_per_host=0, keepalive_timeout=60
                ),
                timeout=self._client_timeout,
                headers=self._headers,
                cookie_jar=aiohttp.DummyCookieJar(),  # a backend's cookies are never sent back
            )
        return self._session

    @asynccontextmanager
    async def sampling_slot(self) -> AsyncIterator[None]:
        """Hold one of the ``max_connections`` sampling slots (waiting, in order, for
        one): a sampling request is sent inside it."""
        self.session()
        slots = self._slots
        if slots is None:  # unbounded
            yield
            return
        self.waiting += 1
        clock = SLOT_WAIT.get()  # the router's try, told how long we queue here
        if clock is not None:
            clock.begin()
        try:
            await slots.acquire()
        finally:
            self.waiting -= 1
            if clock is not None:
                clock.end()
        try:
            yield
        finally:
            slots.release()

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The loop of the current session (for per-loop helpers of a backend)."""
        return self._loop

    async def request_json(
        self,
        method: str,
        path: str,
        body: dict | None = None,
        params: dict | None = None,
        timeout: float | None = None,
    ) -> Any:
        """The parsed JSON answer of a 200; ``LLMError`` otherwise."""
        raw = await self._exchange(method, path, body, params, timeout, None)
        try:
            return json.loads(raw) if raw.strip() else None
        except ValueError as exc:  # UnicodeDecodeError too: JSON is UTF-8 (RFC 8259)
            raise LLMError(
                f"{self.name}: {method} {path} answered non-JSON: {excerpt(_text(raw))}",
                status=200,
                backend=self.name,
                retryable=False,
            ) from exc

    async def request_text(
        self,
        method: str,
        path: str,
        body: dict | None = None,
        params: dict | None = None,
        timeout: float | None = None,
    ) -> str:
        """The body of a 200 as text (vLLM answers some control calls in plain text);
        ``LLMError`` otherwise."""
        text: list[str] = []
        await self._exchange(method, path, body, params, timeout, text)
        return text[0]

    async def _exchange(
        self,
        method: str,
        path: str,
        body: dict | None,
        params: dict | None,
        timeout: float | None,
        text: list[str] | None,
    ) -> bytes:
        """The body of a 200 (also decoded, in its charset, into ``text`` if given);
        ``LLMError`` otherwise."""
        url = self.base_url + path
        kwargs: dict[str, Any] = {"json": body, "params": params}
        if timeout is not None:
            kwargs["timeout"] = aiohttp.ClientTimeout(total=timeout)
        try:
            async with self.session().request(method, url, **kwargs) as resp:
                raw = await resp.read()
                status = resp.status
                if text is not None and status == 200:
                    text.append(raw.decode(resp.get_encoding()))
        except (aiohttp.ClientError, UnicodeDecodeError) as exc:  # bytes not in its charset
            raise LLMError(
                f"{self.name}: {method} {url} failed: {type(exc).__name__}: {exc}",
                backend=self.name,
            ) from exc
        except TimeoutError as exc:  # aiohttp's own timeout, not the caller's
            raise LLMError(
                f"{self.name}: {method} {url} timed out after {timeout or self.timeout} s",
                backend=self.name,
            ) from exc
        if status == 200:
            return raw
        error = _text(raw)
        if context_overflow(status, error):
            raise ContextWindowError(
                f"{self.name}: {method} {path} answered HTTP {status}: {excerpt(error)}",
                status=status,
                backend=self.name,
            )
        raise LLMError(
            f"{self.name}: {method} {path} answered HTTP {status}: {excerpt(error)}",
            status=status,
            backend=self.name,
            retryable=status in RETRYABLE_STATUS,
        )

    async def ok(self, path: str, timeout: float = 5.0) -> bool:
        """True if ``GET path`` answers 200 within ``timeout`` seconds."""
        try:
            async with self.session().get(self.base_url + path, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                await resp.read()
                return resp.status == 200
        except (TimeoutError, aiohttp.ClientError, OSError):
            return False

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None and not session.closed:
            try:
                same_loop = self._loop is asyncio.get_running_loop()
            except RuntimeError:
                same_loop = False
            if same_loop:
                await session.close()
            # else: its loop is gone, and with it the connections
