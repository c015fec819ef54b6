"""A lean HTTP/1.1 client for a plain-``http`` backend: one request at a time on each
kept-alive connection, the response parsed by ``httptools`` (llhttp, in C).

``HTTPClient`` sends its JSON calls to an ``http://`` server through this rather than
aiohttp: a sampling call is a few hundred bytes each way, and aiohttp's machinery per
request (its timers, cookie jar, tracing, payload and response objects) cost about twice
this path's CPU (``benchmarks.concurrency_cpu_ab``). ``https``, a URL with credentials and
the health checks still go through aiohttp.

What a request does:

- takes the most recently used idle connection (LIFO), dropping ones the server closed
  or that sat idle for ``keepalive`` seconds, or opens one (within ``connect_timeout``);
- writes the request (``Host``, ``Accept-Encoding: identity``, the caller's headers,
  ``Content-Length``) and waits for the whole response: ``Content-Length``, chunked, or
  (HTTP/1.0 style) until the server closes;
- puts the connection back only when the response came whole and the server keeps it
  alive; anything else (a cancelled or timed-out caller, a parse error) closes it, so a
  late answer can never be read as the next request's.

Failures are ``WireError``s (``ClientConnectorError``: could not connect;
``ServerDisconnectedError``: the connection ended before a whole response;
``ClientPayloadError``: a response that is not HTTP/1.1 or whose body cannot be read),
named as aiohttp names the same failures so messages read the same. There is no
automatic retry: a POST may have reached the server, and the router decides.
"""

from __future__ import annotations

import asyncio
import codecs
import time
import zlib
from urllib.parse import urlencode, urlsplit

import httptools

__all__ = ["ClientConnectorError", "ClientPayloadError", "Connections", "ServerDisconnectedError", "WireError"]

KEEPALIVE = 60.0  # seconds an idle connection is kept (aiohttp's keepalive_timeout here)


class WireError(Exception):
    """A request that got no whole HTTP response."""


class ClientConnectorError(WireError):
    """No connection to the server."""


class ServerDisconnectedError(WireError):
    """The connection ended before the response was whole."""


class ClientPayloadError(WireError):
    """The response is not one we can read (bad HTTP, unknown content encoding)."""


class _Connection(asyncio.Protocol):
    """One TCP connection; at most one request in flight on it."""

    def __init__(self, pool: Connections) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[tuple[int, bytes, bytes, bytes]] | None = None
        self._body: list[bytes] = []
        self._header: tuple[bytes, bytes] | None = None
        self._content_type = b""
        self._encoding = b""
        self._status: int | None = None
        self._framed = False  # Content-Length or chunked: the body's end is known
        self.keep_alive = False

    # --- asyncio.Protocol ------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ClientPayloadError(f"a response that is not HTTP/1.1: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        if exc is None and self._status is not None and not self._framed:
            self.keep_alive = False  # a body that ends where the connection does
            self._complete()
        else:
            self._fail(ServerDisconnectedError("Server disconnected" + (f": {exc}" if exc else "")))

    # --- httptools callbacks ---------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-type":
            self._content_type = value
        elif name == b"content-encoding":
            self._encoding = value.strip().lower()
        elif name == b"content-length" or (name == b"transfer-encoding" and b"chunked" in value.lower()):
            self._framed = True

    def on_headers_complete(self) -> None:
        self._status = self._parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        if self._status is not None and self._status < 200:  # an interim 1xx: the real answer follows
            self._reset()
            return
        self.keep_alive = self._parser.should_keep_alive()
        self._complete()

    # --- one request -------------------------------------------------------------
    def _reset(self) -> None:
        self._body, self._content_type, self._encoding = [], b"", b""
        self._status, self._framed = None, False

    def _complete(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done() and self._status is not None:
            waiter.set_result((self._status, b"".join(self._body), self._content_type, self._encoding))

    def _fail(self, exc: WireError) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    async def exchange(self, request: bytes) -> tuple[int, bytes, bytes, bytes]:
        assert self.transport is not None
        self._reset()
        self.keep_alive = False
        self._waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return await self._waiter

    def close(self) -> None:
        self.closed = True
        self.pool.forget(self)
        if self.transport is not None:
            self.transport.close()


class Connections:
    """Kept-alive connections to one ``http://`` server (one event loop's)."""

    def __init__(self, base_url: str, connect_timeout: float, keepalive: float = KEEPALIVE) -> None:
        parts = urlsplit(base_url)
        if not self.usable(base_url):
            raise ValueError(f"base_url: expected http://host[:port][/path] without credentials, got {base_url!r}")
        self.host = parts.hostname or ""
        self.port = parts.port or 80
        self.prefix = parts.path.rstrip("/")
        self._host_header = parts.netloc.encode("ascii")
        self.connect_timeout = connect_timeout
        self.keepalive = keepalive
        self._idle: dict[_Connection, float] = {}  # insertion order: oldest first
        self._open: set[_Connection] = set()

    @staticmethod
    def usable(base_url: str) -> bool:
        """Whether this client serves ``base_url``: ``http``, no credentials, an ASCII host."""
        parts = urlsplit(base_url)
        return parts.scheme == "http" and parts.username is None and parts.password is None and parts.netloc.isascii()

    @property
    def open_connections(self) -> int:
        return len(self._open)

    @property
    def idle_connections(self) -> int:
        return len(self._idle)

    def forget(self, conn: _Connection) -> None:
        self._idle.pop(conn, None)
        self._open.discard(conn)

    async def _connection(self) -> _Connection:
        now = time.monotonic()
        while self._idle:
            oldest = next(iter(self._idle))
            if now - self._idle[oldest] <= self.keepalive:
                break
            oldest.close()  # idle too long: closed here, as the server may have
        while self._idle:
            conn, _ = self._idle.popitem()  # the most recently used
            if not conn.closed:
                return conn
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await loop.create_connection(lambda: _Connection(self), self.host, self.port)
        except TimeoutError as exc:
            raise ClientConnectorError(
                f"Connection timeout to host {self.host}:{self.port} after {self.connect_timeout:g} s"
            ) from exc
        except OSError as exc:
            raise ClientConnectorError(f"Cannot connect to host {self.host}:{self.port} [{exc}]") from exc
        self._open.add(conn)
        return conn

    def _request(
        self, method: str, path: str, params: dict | None, headers: dict[str, str], body: bytes | None
    ) -> bytes:
        target = self.prefix + path
        if params:
            target += ("&" if "?" in target else "?") + urlencode(params)
        lines = [
            f"{method} {target} HTTP/1.1".encode("ascii"),
            b"Host: " + self._host_header,
            b"Accept: */*",
            b"Accept-Encoding: identity",
        ]
        lines += [f"{k}: {v}".encode("latin-1") for k, v in headers.items()]
        if body is not None:
            lines += [b"Content-Type: application/json", b"Content-Length: %d" % len(body)]
        elif method not in ("GET", "HEAD", "OPTIONS"):
            lines.append(b"Content-Length: 0")
        return b"\r\n".join(lines) + b"\r\n\r\n" + (body or b"")

    async def request(
        self, method: str, path: str, headers: dict[str, str], body: bytes | None = None, params: dict | None = None
    ) -> tuple[int, str]:
        """The status and the body as text (in the charset the response names, else
        UTF-8; ``UnicodeDecodeError`` when it is not); ``WireError`` when no whole
        response came. The caller bounds the time (``asyncio.timeout``)."""
        request = self._request(method, path, params, headers, body)
        conn = await self._connection()
        done = False
        try:
            status, raw, content_type, encoding = await conn.exchange(request)
            done = True
        finally:
            if done and conn.keep_alive and not conn.closed:
                self._idle[conn] = time.monotonic()
            else:
                conn.close()  # cancelled, failed, or not kept alive: never reused
        return status, _decode(raw, content_type, encoding)

    def close(self) -> None:
        for conn in list(self._open):
            conn.close()
        self._idle.clear()


def _charset(content_type: bytes) -> str:
    for part in content_type.split(b";")[1:]:
        key, _, value = part.partition(b"=")
        if key.strip().lower() == b"charset":
            name = value.strip().strip(b"\"'").decode("latin-1")
            try:
                return codecs.lookup(name).name
            except LookupError:
                break
    return "utf-8"


def _decode(raw: bytes, content_type: bytes, encoding: bytes) -> str:
    if encoding and encoding != b"identity":  # (asked for identity, but a server may not listen)
        try:
            if encoding in (b"gzip", b"x-gzip"):
                raw = zlib.decompress(raw, 16 + zlib.MAX_WBITS)
            elif encoding == b"deflate":
                raw = zlib.decompress(raw)
            else:
                raise ClientPayloadError(f"a response in an unknown content encoding: {encoding.decode('latin-1')}")
        except zlib.error as exc:
            raise ClientPayloadError(
                f"a {encoding.decode('latin-1')} response that does not decompress: {exc}"
            ) from exc
    return raw.decode(_charset(content_type))
