"""What both clients share: settings, response handling, the 429 retry policy, and the
API's calls as typed methods (``Endpoint``: ``client.submit(...)`` answers a
``SubmitResponse`` in the sync client, an awaitable of one in the async client)."""

from __future__ import annotations

import functools
import os
from collections.abc import Awaitable, Callable
from typing import Any, Generic, ParamSpec, TypeVar, overload

import httpx
from pydantic import BaseModel, ValidationError

from rollserve import __version__
from rollserve.client import calls
from rollserve.client.calls import Call, RollserveError

MAX_429_RETRIES = 8
MAX_BACKOFF = 30.0

P = ParamSpec("P")
T = TypeVar("T", bound=BaseModel)


class SyncSender:
    """A client that sends a call and returns its answer."""

    def _send(self, call: Call[T]) -> T:
        raise NotImplementedError


class AsyncSender:
    """A client that sends a call and returns an awaitable of its answer."""

    async def _send(self, call: Call[T]) -> T:
        raise NotImplementedError


class Endpoint(Generic[P, T]):
    """One API call as a client method: ``build`` makes the ``Call``; the client sends it."""

    def __init__(self, build: Callable[P, Call[T]]) -> None:
        self.build = build

    @overload
    def __get__(self, client: None, owner: type | None = None) -> Endpoint[P, T]: ...

    @overload
    def __get__(self, client: AsyncSender, owner: type | None = None) -> Callable[P, Awaitable[T]]: ...

    @overload
    def __get__(self, client: SyncSender, owner: type | None = None) -> Callable[P, T]: ...

    def __get__(
        self, client: SyncSender | AsyncSender | None, owner: type | None = None
    ) -> Endpoint[P, T] | Callable[P, Any]:
        if client is None:
            return self
        send = client._send

        @functools.wraps(self.build)
        def method(*args: P.args, **kwargs: P.kwargs) -> Any:
            return send(self.build(*args, **kwargs))

        return method


class ClientBase:
    def __init__(self, base_url: str = "http://127.0.0.1:8000", token: str | None = None, timeout: float = 30.0):
        self.base_url = base_url.rstrip("/")
        self.token = token if token is not None else os.environ.get("ROLLSERVE_API_TOKEN")
        self.timeout = timeout

    # Every call of the API (rollserve.client.calls), answered as its contract model.
    submit = Endpoint(calls.submit)
    run = Endpoint(calls.run)
    rollout = Endpoint(calls.rollout)
    group = Endpoint(calls.group)
    results = Endpoint(calls.results)
    rescore = Endpoint(calls.rescore)
    cancel = Endpoint(calls.cancel)
    cancel_group = Endpoint(calls.cancel_group)
    status = Endpoint(calls.status)
    health = Endpoint(calls.health)
    add_backend = Endpoint(calls.add_backend)
    list_backends = Endpoint(calls.list_backends)
    remove_backend = Endpoint(calls.remove_backend)
    pause = Endpoint(calls.pause)
    resume = Endpoint(calls.resume)
    load_weights = Endpoint(calls.load_weights)

    def _headers(self) -> dict[str, str]:
        """Every request's headers: the client's version (``User-Agent: rollserve/0.2.0``,
        in the server's access log) and the bearer token, if any."""
        headers = {"User-Agent": f"rollserve/{__version__}"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    def _timeout(self, call: Call[T]) -> httpx.Timeout:
        return httpx.Timeout(self.timeout, read=max(self.timeout, call.read_timeout))

    @staticmethod
    def _parse(response: httpx.Response, call: Call[T]) -> T:
        """The answer validated into the call's model, or ``RollserveError``."""
        if response.status_code >= 400:
            fields: tuple[str, ...] = ()
            try:
                body = response.json()
                detail = body.get("detail", response.text) if isinstance(body, dict) else body
                found = body.get("errors") if isinstance(body, dict) else None
                if isinstance(found, list):
                    fields = tuple(str(e["field"]) for e in found if isinstance(e, dict) and "field" in e)
            except ValueError:
                detail = response.text
            raise RollserveError(response.status_code, detail, fields)
        try:
            return call.response.model_validate_json(response.content)
        except ValidationError:  # pydantic's parser refuses an escaped lone surrogate; json does not
            return call.response.model_validate(response.json())

    @staticmethod
    def _retry_delay(response: httpx.Response, attempt: int) -> float | None:
        """Seconds to wait before retrying a 429 (the server refused the whole batch,
        so a retry cannot duplicate work) or a 409 with Retry-After (a re-scoring under
        the call's idempotency key still runs: the retry gets its answer), or None to
        give up."""
        retried = response.status_code == 429 or (response.status_code == 409 and "retry-after" in response.headers)
        if not retried or attempt >= MAX_429_RETRIES:
            return None
        try:
            hinted = float(str(response.headers.get("retry-after", "1")))
        except ValueError:
            hinted = 1.0
        return min(MAX_BACKOFF, max(hinted, 0.5 * 2.0**attempt))
