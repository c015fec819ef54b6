"""The asyncio client, for trainers that run an event loop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Self

import httpx

from rollserve.client.base import AsyncSender, ClientBase, T
from rollserve.client.calls import Call
from rollserve.contract import GroupView, RolloutResult


class AsyncClient(AsyncSender, ClientBase):
    """``await AsyncClient(url).submit([...])``; every call is a coroutine, every answer
    a ``rollserve.contract`` model."""

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        token: str | None = None,
        timeout: float = 30.0,
        max_connections: int = 100,
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        super().__init__(base_url, token, timeout)
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers=self._headers(),
            limits=httpx.Limits(max_connections=max_connections),
            transport=transport,
        )

    async def _send(self, call: Call[T]) -> T:
        attempt = 0
        while True:
            response = await self._http.request(
                call.method, call.path, params=call.params, json=call.json, timeout=self._timeout(call)
            )
            delay = self._retry_delay(response, attempt)
            if delay is None:
                return self._parse(response, call)
            await asyncio.sleep(delay)
            attempt += 1

    async def wait_group(self, group_id: str, timeout: float = 3600.0) -> GroupView:
        """Long-poll until every rollout of the group is finished (or ``timeout``)."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            view = await self.group(group_id, wait=max(0.0, min(remaining, 60.0)))
            if view.done or remaining <= 0:
                return view

    async def stream_results(
        self,
        after: int = 0,
        limit: int = 100,
        wait: float = 30.0,
        until: int | None = None,
        rescored: bool | None = False,
    ) -> AsyncIterator[RolloutResult]:
        """Yield finished results in completion order, forever or until ``until`` seen.
        Re-scored results (``rescored_from`` set: the same samples scored again) are
        left out unless ``rescored`` is True (only them) or None (every result)."""
        seen = 0
        while until is None or seen < until:
            page = await self.results(after=after, limit=limit, wait=wait, rescored=rescored)
            for result in page.results:
                yield result
                seen += 1
            after = page.next

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
