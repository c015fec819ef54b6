"""What both clients share: settings, response handling, the 429 retry policy."""

from __future__ import annotations

import os
from typing import Any, Callable

import httpx

from rollserve.client import calls
from rollserve.client.calls import Call, RollserveError

# Calls every client offers, straight from calls.py; the clients add a few helpers.
API_CALLS = ("submit", "run", "rollout", "group", "results", "cancel", "cancel_group",
             "status", "health", "add_backend", "list_backends", "remove_backend")

MAX_429_RETRIES = 8
MAX_BACKOFF = 30.0


class ClientBase:
    def __init__(self, base_url: str = "http://127.0.0.1:8000", token: str | None = None,
                 timeout: float = 30.0):
        self.base_url = base_url.rstrip("/")
        self.token = token if token is not None else os.environ.get("ROLLSERVE_API_TOKEN")
        self.timeout = timeout

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def _timeout(self, call: Call) -> httpx.Timeout:
        return httpx.Timeout(self.timeout, read=max(self.timeout, call.read_timeout))

    @staticmethod
    def _parse(response: httpx.Response) -> Any:
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail", response.text)
            except ValueError:
                detail = response.text
            raise RollserveError(response.status_code, detail)
        return response.json()

    @staticmethod
    def _retry_delay(response: httpx.Response, attempt: int) -> float | None:
        """Seconds to wait before retrying a 429 (the server refused the whole batch,
        so a retry cannot duplicate work), or None to give up."""
        if response.status_code != 429 or attempt >= MAX_429_RETRIES:
            return None
        try:
            hinted = float(response.headers.get("retry-after", "1"))
        except ValueError:
            hinted = 1.0
        return min(MAX_BACKOFF, max(hinted, 0.5 * 2**attempt))


def bind_calls(cls: type) -> type:
    """Add one method per API call to a client class whose ``_send(call)`` sends it."""
    for name in API_CALLS:
        build: Callable[..., Call] = getattr(calls, name)

        def method(self: Any, *args: Any, _build: Callable[..., Call] = build, **kwargs: Any) -> Any:
            return self._send(_build(*args, **kwargs))

        method.__name__ = name
        method.__doc__ = build.__doc__
        setattr(cls, name, method)
    return cls
