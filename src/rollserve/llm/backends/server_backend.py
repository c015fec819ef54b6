"""What the HTTP inference servers (vLLM, SGLang, llama.cpp) have in common.

A subclass says how to turn (prompt ids, sampling) into a request and a reply into
a ``Generation``; this class holds the HTTP client, the model name (discovered on
first use if unset), the count of requests in flight, health and ``describe()``.

The context window: the most tokens a prompt and its sample may hold on the server
(vLLM's and SGLang's ``max_model_len`` in ``/v1/models``, llama.cpp's ``n_ctx`` in
``/props``), read at the health checks (again after a failed one: a restarted
server may have another) and before the first request. A request is never sent
longer: ``max_tokens`` is cut to what is left, and a prompt with no room left fails
with ``ContextWindowError`` unsent (the agent loop ends the episode there).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from rollserve.errors import ContextWindowError, LLMError
from rollserve.llm.backends.http import MAX_CONNECTIONS, HTTPClient, excerpt, host_port
from rollserve.llm.base import Generation, LLMBackend, SamplingParams

log = logging.getLogger(__name__)

WINDOW_TIMEOUT = 5.0  # seconds a read of the context window may take
HEALTH_WINDOW_TIMEOUT = 2.0  # the same, inside a health check
WINDOW_RETRY = 30.0  # seconds before a request tries again to read an unknown window


class ServerBackend(LLMBackend):
    kind = "server"
    trainable = True
    health_path = "/health"
    models_path: str | None = "/v1/models"  # where the served model's name is read
    window_path: str | None = "/v1/models"  # where the context window is read
    # Tokens the server wants left over: SGLang refuses prompt + max_new_tokens equal
    # to its context length, vLLM and llama.cpp take up to it.
    window_slack = 0

    def __init__(
        self,
        url: str,
        name: str | None = None,
        model: str | None = None,
        api_key: str | None = None,
        timeout: float | None = 600.0,
        connect_timeout: float = 10.0,
        weight: float = 1.0,
        max_connections: int = MAX_CONNECTIONS,
    ):
        name = name or f"{self.kind}@{host_port(url)}"
        self.http = HTTPClient(
            url,
            name,
            api_key=api_key,
            timeout=timeout,
            connect_timeout=connect_timeout,
            max_connections=max_connections,
        )
        self.name = name
        self.model = model
        self.timeout = timeout
        self.weight = weight
        self.outstanding = 0
        self.max_model_len: int | None = None  # as the server reports it; None: unknown
        self._window_read_at = -WINDOW_RETRY  # monotonic time of the last try
        self._reading: asyncio.Task | None = None  # the window's read in flight
        self._model_lock: asyncio.Lock | None = None
        self._lock_loop: asyncio.AbstractEventLoop | None = None

    @property
    def url(self) -> str:
        return self.http.base_url

    # --- protocol ----------------------------------------------------------------
    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        if not prompt_ids:
            raise LLMError(f"{self.name}: empty prompt", backend=self.name, retryable=False)
        sampling = await self.fit_window(prompt_ids, sampling)
        self.outstanding += 1
        try:
            async with self.http.sampling_slot():  # the bounded connection pool
                return await self._generate(list(prompt_ids), sampling)
        finally:
            self.outstanding -= 1

    async def health(self) -> bool:
        ok = await self.http.ok(self.health_path)
        if not ok:
            self.max_model_len = None  # read again once it is back: it may have restarted
        elif self.max_model_len is None:  # short: the probe itself is bounded (5 s)
            await self.read_context_window(timeout=HEALTH_WINDOW_TIMEOUT)
        return ok

    # --- the context window ----------------------------------------------------------
    def context_window(self) -> int | None:
        """The most tokens a prompt and its sample may hold here, if known."""
        if self.max_model_len is None:
            return None
        return self.max_model_len - self.window_slack

    async def read_context_window(self, timeout: float = WINDOW_TIMEOUT) -> int | None:
        """Read the window from the server (bounded; a failure leaves it unknown). One
        read at a time: a caller that comes while another reads it joins that read, so
        no request goes out unchecked meanwhile; all its waiters wake together."""
        if self.window_path is None:
            return None
        loop = asyncio.get_running_loop()
        reading = self._reading
        if reading is None or reading.get_loop() is not loop:
            reading = self._reading = loop.create_task(self._read_window(timeout))
            reading.add_done_callback(self._window_read_done)
        await asyncio.shield(reading)  # a waiter cancelled leaves the read to the others
        return self.context_window()

    async def _read_window(self, timeout: float) -> None:
        self._window_read_at = time.monotonic()
        try:
            reply = await self.http.request_json("GET", self.window_path or "", timeout=timeout)
        except LLMError as error:
            log.debug("%s: could not read the context window: %s", self.name, error.message)
            return
        window = self.parse_window(reply)
        if isinstance(window, int) and not isinstance(window, bool) and window > 0:
            self.max_model_len = window

    def parse_window(self, reply: Any) -> Any:
        """The window in ``window_path``'s reply: ``max_model_len`` of the served model's
        entry in ``/v1/models`` (vLLM, SGLang), or of the only entry."""
        try:
            cards = [c for c in reply["data"] if isinstance(c, dict)]
        except (KeyError, TypeError):
            return None
        named = [c for c in cards if c.get("id") == self.model]
        card = named[0] if named else cards[0] if cards and (len(cards) == 1 or self.model is None) else None
        return card.get("max_model_len") if card else None

    async def fit_window(self, prompt_ids: list[int], sampling: SamplingParams) -> SamplingParams:
        """``sampling`` with ``max_tokens`` cut to what the window leaves after the prompt;
        ``ContextWindowError`` (nothing sent) when it leaves nothing."""
        if self.max_model_len is None and self.window_path is not None:
            await self._window_read()
        window = self.context_window()
        if window is None:
            return sampling
        room = window - len(prompt_ids)
        if room < 1:
            raise ContextWindowError(
                f"{self.name}: the prompt is {len(prompt_ids)} tokens and the server's context "
                f"window is {self.max_model_len}: no room to sample (not sent)",
                backend=self.name,
            )
        if sampling.max_tokens > room:
            sampling = sampling.model_copy(update={"max_tokens": room})
        return sampling

    async def close(self) -> None:
        await self.http.close()

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "url": self.url,
            "model": self.model,
            "trainable": self.trainable,
            "outstanding": self.outstanding,
            "max_connections": self.http.max_connections,
            "waiting_for_connection": self.http.waiting,
            "max_model_len": self.max_model_len,
        }

    # --- for subclasses ------------------------------------------------------------
    async def _generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        raise NotImplementedError

    def malformed(self, what: str, reply: Any, cause: Exception | None = None) -> LLMError:
        """A reply we cannot read: not retryable (every server of the kind answers so)."""
        detail = f" ({cause})" if cause is not None else ""
        return LLMError(f"{self.name}: malformed {what}{detail}: {excerpt(reply)}", backend=self.name, retryable=False)

    def inconsistent(self, message: str) -> LLMError:
        """The reply contradicts itself or the request: its tokens cannot be trusted."""
        return LLMError(f"{self.name}: {message}", backend=self.name, retryable=False)

    async def _window_read(self) -> None:
        """Read the unknown window for a request: joins a read in flight, else starts one
        at most once per ``WINDOW_RETRY``."""
        reading = self._reading
        if reading is None or reading.get_loop() is not asyncio.get_running_loop():
            if time.monotonic() - self._window_read_at < WINDOW_RETRY:
                return
        await self.read_context_window()

    def _window_read_done(self, reading: asyncio.Task) -> None:
        if self._reading is reading:
            self._reading = None
        if not reading.cancelled():
            reading.exception()  # retrieved: the waiters got it

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
