"""The blocking client, for scripts and trainers without an event loop."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Self

import httpx

from rollserve.client.base import ClientBase, SyncSender, T
from rollserve.client.calls import Call
from rollserve.contract import GroupView, RolloutResult


class Client(SyncSender, ClientBase):
    """``Client(url).submit([...])``, ``.group(id, wait=60)``, ``.stream_results()``, ...;
    every answer is a ``rollserve.contract`` model."""

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        token: str | None = None,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ):
        super().__init__(base_url, token, timeout)
        self._http = httpx.Client(base_url=self.base_url, headers=self._headers(), transport=transport)

    def _send(self, call: Call[T]) -> T:
        attempt = 0
        while True:
            response = self._http.request(
                call.method, call.path, params=call.params, json=call.json, timeout=self._timeout(call)
            )
            delay = self._retry_delay(response, attempt)
            if delay is None:
                return self._parse(response, call)
            time.sleep(delay)
            attempt += 1

    def wait_group(self, group_id: str, timeout: float = 3600.0) -> GroupView:
        """Long-poll until every rollout of the group is finished (or ``timeout``)."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            view = self.group(group_id, wait=max(0.0, min(remaining, 60.0)))
            if view.done or remaining <= 0:
                return view

    def stream_results(
        self,
        after: int = 0,
        limit: int = 100,
        wait: float = 30.0,
        until: int | None = None,
        rescored: bool | None = False,
    ) -> Iterator[RolloutResult]:
        """Yield finished results in completion order, forever or until ``until`` seen.
        Re-scored results (``rescored_from`` set: the same samples scored again) are
        left out unless ``rescored`` is True (only them) or None (every result).

        Each result has ``seq``: persist the last one to resume after a crash.
        """
        seen = 0
        while until is None or seen < until:
            page = self.results(after=after, limit=limit, wait=wait, rescored=rescored)
            for result in page.results:
                yield result
                seen += 1
            after = page.next

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
