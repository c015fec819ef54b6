"""A vLLM (OpenAI-compatible) server as a backend: token ids in, sampled ids out.

We post token-id prompts to ``/v1/completions`` (never chat messages), so the server
cannot re-render or re-tokenize anything, and ask for the sampled ids and their
logprobs back (``return_token_ids``, ``logprobs: 0``). Servers without
``return_token_ids`` still give ids through ``return_tokens_as_token_ids``
("token_id:N" strings), which we send too.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from rollserve.errors import LLMError
from rollserve.llm.base import Generation, SamplingParams

_BODY_EXCERPT = 300  # characters of an error body worth putting in a message


class VLLMBackend:
    """One vLLM server; one aiohttp session (unbounded connection pool) per backend."""

    kind = "vllm"
    trainable = True

    def __init__(
        self,
        url: str,
        name: str | None = None,
        model: str | None = None,
        api_key: str | None = None,
        timeout: float | None = 600.0,
        connect_timeout: float = 10.0,
    ):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"url: expected http(s)://host:port, got {url!r}")
        self.url = url.rstrip("/")
        self.name = name or f"vllm@{parts.netloc}"
        self.model = model
        self.timeout = timeout
        self.outstanding = 0
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client_timeout = aiohttp.ClientTimeout(total=timeout, sock_connect=connect_timeout)
        self._session: aiohttp.ClientSession | None = None
        self._session_loop: asyncio.AbstractEventLoop | None = None
        self._model_lock: asyncio.Lock | None = None

    # --- protocol ----------------------------------------------------------------
    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        if not prompt_ids:
            raise LLMError(f"{self.name}: empty prompt")
        model = self.model or await self._discover_model()
        body = self._request_body(model, prompt_ids, sampling)
        self.outstanding += 1
        try:
            reply = await self._post_json("/v1/completions", body)
        finally:
            self.outstanding -= 1
        return self._parse(reply, prompt_ids)

    async def health(self) -> bool:
        try:
            async with self._client().get(
                self.url + "/health", timeout=aiohttp.ClientTimeout(total=5)
            ) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            return False

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None and not session.closed:
            if self._session_loop is asyncio.get_running_loop():
                await session.close()
            # else: its loop is gone, and with it the connections

    def describe(self) -> dict:
        return {
            "name": self.name,
            "kind": self.kind,
            "url": self.url,
            "model": self.model,
            "trainable": self.trainable,
            "outstanding": self.outstanding,
        }

    # --- request and reply -------------------------------------------------------
    @staticmethod
    def _request_body(model: str, prompt_ids: list[int], sampling: SamplingParams) -> dict:
        body: dict[str, Any] = {
            "model": model,
            "prompt": prompt_ids,
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "n": 1,
            "stream": False,
            "logprobs": 0,  # the sampled token's own logprob, no alternatives
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
        }
        if sampling.top_k > 0:
            body["top_k"] = sampling.top_k
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if sampling.stop_token_ids:
            body["stop_token_ids"] = list(sampling.stop_token_ids)
        return body

    def _parse(self, reply: Any, prompt_ids: list[int]) -> Generation:
        try:
            choice = reply["choices"][0]
            logprobs = choice.get("logprobs") or {}
            token_logprobs = logprobs.get("token_logprobs")
            output_ids = choice.get("token_ids")
            if output_ids is None:
                output_ids = [_id_from_token(t) for t in logprobs.get("tokens") or []]
            if token_logprobs is None:
                raise ValueError("no logprobs.token_logprobs in the reply")
            output_ids = [int(t) for t in output_ids]
            token_logprobs = [float(lp) for lp in token_logprobs]
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            raise LLMError(
                f"{self.name}: malformed completion reply ({exc}): {_excerpt(reply)}"
            ) from exc
        if len(output_ids) != len(token_logprobs):
            raise LLMError(
                f"{self.name}: reply has {len(output_ids)} token ids "
                f"but {len(token_logprobs)} logprobs"
            )
        echoed = choice.get("prompt_token_ids")
        if echoed is not None and echoed != prompt_ids:
            # The server saw different ids than we sent: every token after is suspect.
            raise LLMError(f"{self.name}: the server's prompt_token_ids differ from the prompt sent")
        usage = reply.get("usage") or {}
        return Generation(
            output_ids=output_ids,
            logprobs=token_logprobs,
            finish_reason=choice.get("finish_reason") or "abort",
            backend=self.name,
            meta={
                "request_id": reply.get("id"),
                "stop_reason": choice.get("stop_reason"),
                "prompt_tokens": usage.get("prompt_tokens"),
            },
        )

    # --- HTTP ----------------------------------------------------------------------
    def _client(self) -> aiohttp.ClientSession:
        # Made lazily, per event loop: an aiohttp session belongs to the loop it was
        # made on (a backend may outlive a loop, e.g. across tests or asyncio.run calls).
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._session_loop is not loop:
            self._session_loop = loop
            self._model_lock = None  # an asyncio.Lock is bound to one loop too
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60),
                timeout=self._client_timeout,
                headers=self._headers,
            )
        return self._session

    async def _post_json(self, path: str, body: dict) -> Any:
        return await self._request("POST", path, body)

    async def _request(self, method: str, path: str, body: dict | None = None) -> Any:
        url = self.url + path
        try:
            async with self._client().request(method, url, json=body) as resp:
                text = await resp.text()
                if resp.status != 200:
                    raise LLMError(
                        f"{self.name}: {method} {path} answered HTTP {resp.status}: "
                        f"{_excerpt(text)}"
                    )
        except aiohttp.ClientError as exc:
            raise LLMError(f"{self.name}: {method} {url} failed: {type(exc).__name__}: {exc}") from exc
        except asyncio.TimeoutError as exc:  # aiohttp's own timeout, not the caller's
            raise LLMError(f"{self.name}: {method} {url} timed out after {self.timeout} s") from exc
        try:
            return json.loads(text)
        except ValueError as exc:
            raise LLMError(f"{self.name}: {method} {path} answered non-JSON: {_excerpt(text)}") from exc

    async def _discover_model(self) -> str:
        """The first model the server serves (asked once, on first use)."""
        if self._model_lock is None:
            self._model_lock = asyncio.Lock()
        async with self._model_lock:
            if self.model is None:
                reply = await self._request("GET", "/v1/models")
                try:
                    self.model = str(reply["data"][0]["id"])
                except (KeyError, IndexError, TypeError) as exc:
                    raise LLMError(
                        f"{self.name}: /v1/models lists no model: {_excerpt(reply)}"
                    ) from exc
        return self.model


def _id_from_token(token: Any) -> int:
    """``"token_id:42"`` (vLLM's ``return_tokens_as_token_ids``) -> 42."""
    if isinstance(token, str) and token.startswith("token_id:"):
        return int(token[len("token_id:"):])
    raise ValueError(
        f"no token_ids in the reply and token {token!r} is not 'token_id:N' "
        "(is this a vLLM server with return_token_ids or return_tokens_as_token_ids?)"
    )


def _excerpt(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= _BODY_EXCERPT else text[:_BODY_EXCERPT] + "..."
