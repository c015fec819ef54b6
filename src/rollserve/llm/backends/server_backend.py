"""What the HTTP inference servers (vLLM, SGLang, llama.cpp) have in common.

A subclass says how to turn (prompt ids, sampling) into a request and a reply into
a ``Generation``; this class holds the HTTP client, the model name (discovered on
first use if unset), the count of requests in flight, health and ``describe()``.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit

from rollserve.errors import LLMError
from rollserve.llm.base import Generation, SamplingParams
from rollserve.llm.backends.http import HTTPClient, excerpt


class ServerBackend:
    kind = "server"
    trainable = True
    health_path = "/health"
    models_path: str | None = "/v1/models"  # where the served model's name is read

    def __init__(
        self,
        url: str,
        name: str | None = None,
        model: str | None = None,
        api_key: str | None = None,
        timeout: float | None = 600.0,
        connect_timeout: float = 10.0,
        weight: float = 1.0,
    ):
        name = name or f"{self.kind}@{urlsplit(url).netloc}"
        self.http = HTTPClient(url, name, api_key=api_key, timeout=timeout,
                               connect_timeout=connect_timeout)
        self.name = name
        self.model = model
        self.timeout = timeout
        self.weight = weight
        self.outstanding = 0
        self._model_lock: asyncio.Lock | None = None
        self._lock_loop: asyncio.AbstractEventLoop | None = None

    @property
    def url(self) -> str:
        return self.http.base_url

    # --- protocol ----------------------------------------------------------------
    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        if not prompt_ids:
            raise LLMError(f"{self.name}: empty prompt", backend=self.name, retryable=False)
        self.outstanding += 1
        try:
            return await self._generate(list(prompt_ids), sampling)
        finally:
            self.outstanding -= 1

    async def health(self) -> bool:
        return await self.http.ok(self.health_path)

    async def close(self) -> None:
        await self.http.close()

    def describe(self) -> dict:
        return {
            "name": self.name,
            "kind": self.kind,
            "url": self.url,
            "model": self.model,
            "trainable": self.trainable,
            "outstanding": self.outstanding,
        }

    # --- for subclasses ------------------------------------------------------------
    async def _generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        raise NotImplementedError

    def malformed(self, what: str, reply: Any, cause: Exception | None = None) -> LLMError:
        """A reply we cannot read: not retryable (every server of the kind answers so)."""
        detail = f" ({cause})" if cause is not None else ""
        return LLMError(f"{self.name}: malformed {what}{detail}: {excerpt(reply)}",
                        backend=self.name, retryable=False)

    def inconsistent(self, message: str) -> LLMError:
        """The reply contradicts itself or the request: its tokens cannot be trusted."""
        return LLMError(f"{self.name}: {message}", backend=self.name, retryable=False)

    async def served_model(self) -> str | None:
        """The model to name in requests: as configured, else the server's first."""
        if self.model is not None or self.models_path is None:
            return self.model
        loop = asyncio.get_running_loop()
        if self._model_lock is None or self._lock_loop is not loop:  # a lock is per loop
            self._model_lock, self._lock_loop = asyncio.Lock(), loop
        async with self._model_lock:
            if self.model is None:
                reply = await self.http.request_json("GET", self.models_path)
                try:
                    self.model = str(reply["data"][0]["id"])
                except (KeyError, IndexError, TypeError) as exc:
                    raise self.malformed(f"{self.models_path} (lists no model)", reply, exc) from exc
        return self.model
