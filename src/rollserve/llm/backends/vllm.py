"""A vLLM server as a backend: token ids in, sampled ids out.

Two endpoints, both token-in/token-out, so the server never re-renders or
re-tokenizes anything:

- ``/v1/completions`` (default, every vLLM): a token-id ``prompt``, with the sampled
  ids and logprobs asked back (``return_token_ids``, ``logprobs: 0``). Servers
  without ``return_token_ids`` still give ids via ``return_tokens_as_token_ids``
  ("token_id:N" strings), which we send too.
- ``/inference/v1/generate`` (vLLM's tokens-only API, served with
  ``--enable-scale-out`` or ``--tokens-only``; schema read from vLLM 0.32's
  ``entrypoints/scale_out/token_in_token_out/protocol.py``): ``token_ids`` and
  ``sampling_params`` in; ``choices[0].token_ids`` and ``logprobs.content[i]
  .{token_id, logprob}`` out. ``endpoint="auto"`` tries it once and falls back to
  completions on a 404.

In dev mode (``VLLM_SERVER_DEV_MODE=1``) vLLM also serves ``POST /pause?mode=`` and
``POST /resume``, which the router may forward around a weight update.

New weights (``LoadsWeights``; the router calls these while generation is paused):

- a LoRA adapter: ``POST /v1/load_lora_adapter {"lora_name", "lora_path",
  "load_inplace": true}`` (served with ``--enable-lora`` and
  ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``; vLLM answers a 200 in plain text). Every
  later request names the adapter as its ``model``: base and LoRA requests are never
  mixed on one server (in one batch they come back wrong on vLLM CPU).
- full weights from disk (dev mode): ``POST /pause?mode=wait``, ``POST
  /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": DIR}}``,
  ``POST /resume``; later requests name the base model again.

After either load, while generation is paused, the server's prefix cache is reset
(dev mode's ``POST /reset_prefix_cache``). vLLM keys a LoRA's cached KV blocks by the
adapter's name (vLLM 0.32: name and path), not by its weights, so without the reset a
request after an in-place reload can reuse blocks computed with the previous version
(vLLM issue #42125), and ``reload_weights`` leaves the prefix cache as it was. A server
that cannot reset (not in dev mode: 404) fails the load, unless the backend says its
server caches no prefixes (``prefix_cache="off"``: started with
``--no-enable-prefix-caching``).
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar, Literal

from rollserve.errors import LLMError
from rollserve.llm.backends.server_backend import ServerBackend
from rollserve.llm.base import (
    Generation,
    LoadsWeights,
    Pausable,
    PauseMode,
    SamplingParams,
    WeightsKind,
)

COMPLETIONS = "/v1/completions"
GENERATE = "/inference/v1/generate"
Endpoint = Literal["completions", "generate", "auto"]
_PAUSE_MODES = {"finish": "wait", "abort": "abort"}  # ours -> vLLM's
LOAD_LORA = "/v1/load_lora_adapter"
COLLECTIVE_RPC = "/collective_rpc"
_NO_RUNTIME_LORA = "serve it with --enable-lora and the environment variable VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"
_NO_DEV_MODE = "serve it with the environment variable VLLM_SERVER_DEV_MODE=1"
RESET_PREFIX_CACHE = "/reset_prefix_cache"
PrefixCache = Literal["reset", "off"]
_NO_RESET = (
    "serve it with the environment variable VLLM_SERVER_DEV_MODE=1 (rollserve then "
    "resets its prefix cache after each load), or, if it was started with "
    '--no-enable-prefix-caching, register it with "prefix_cache": "off"'
)
RESET_TRIES = 5  # vLLM refuses a reset ({"success": false}) while blocks are still held
RESET_BACKOFF = 0.2  # seconds before the first retry, doubled after each


class VLLMBackend(ServerBackend, Pausable, LoadsWeights):
    """One vLLM server (one aiohttp session, unbounded connection pool)."""

    kind = "vllm"
    weight_kinds: ClassVar[frozenset[WeightsKind]] = frozenset({"lora", "full"})

    def __init__(
        self,
        url: str,
        *args: Any,
        endpoint: Endpoint = "completions",
        prefix_cache: PrefixCache = "reset",
        **kwargs: Any,
    ):
        """``ServerBackend``'s arguments, plus which vLLM endpoint samples and whether
        its prefix cache is reset after a weight load (``"off"``: the server was started
        with ``--no-enable-prefix-caching``, so there is nothing to reset)."""
        super().__init__(url, *args, **kwargs)
        if endpoint not in ("completions", "generate", "auto"):
            raise ValueError(f"endpoint: expected completions, generate or auto, got {endpoint!r}")
        if prefix_cache not in ("reset", "off"):
            raise ValueError(f"prefix_cache: expected reset or off, got {prefix_cache!r}")
        self.endpoint: Endpoint = endpoint
        self.prefix_cache: PrefixCache = prefix_cache
        self.base_model: str | None = None  # the served model's own name, once a LoRA is loaded
        self.lora: str | None = None  # the adapter every request names (None: the base model)

    # --- protocol ----------------------------------------------------------------
    async def _generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        model = await self.served_model()
        if self.endpoint != "completions":
            try:
                reply = await self._post_json(GENERATE, generate_body(model, prompt_ids, sampling))
            except LLMError as exc:
                if self.endpoint == "auto" and exc.status in (404, 405):
                    self.endpoint = "completions"  # this server has no tokens-only API
                else:
                    raise
            else:
                self.endpoint = "generate"
                return self._parse_generate(reply, prompt_ids)
        reply = await self._post_json(COMPLETIONS, completions_body(model, prompt_ids, sampling))
        return self._parse_completion(reply, prompt_ids)

    async def pause(self, mode: PauseMode = "finish") -> None:
        """vLLM dev mode: stop the engine (``wait`` drains it, ``abort`` aborts in flight)."""
        await self.http.request_json("POST", "/pause", params={"mode": _PAUSE_MODES.get(mode, mode)})

    async def resume(self) -> None:
        await self.http.request_json("POST", "/resume")

    # --- new weights (LoadsWeights) ------------------------------------------------
    async def load_lora(self, name: str, path: str) -> None:
        """``/v1/load_lora_adapter`` in place, then the prefix cache reset; from now on
        every request names ``name`` (the server serves it, even if the reset failed)."""
        base = await self._base()
        try:
            await self.http.request_text(
                "POST", LOAD_LORA, {"lora_name": name, "lora_path": path, "load_inplace": True}
            )
        except LLMError as exc:
            if exc.status in (404, 405) and "no adapter found" not in exc.message.lower():
                raise LLMError(
                    f"{self.name}: this vLLM server cannot load LoRA adapters at run "
                    f"time ({exc.message}); {_NO_RUNTIME_LORA}",
                    status=exc.status,
                    backend=self.name,
                    retryable=False,
                ) from exc
            raise
        self.base_model, self.lora, self.model = base, name, name
        await self.reset_prefix_cache()

    async def load_full(self, path: str, policy_version: int | None = None) -> None:
        """Dev mode: pause the engine, ``reload_weights`` from ``path``, reset the prefix
        cache, resume it; from now on requests name the base model."""
        base = await self._base()
        try:
            await self.http.request_json("POST", "/pause", params={"mode": "wait"})
        except LLMError as exc:
            if exc.status in (404, 405):
                raise LLMError(
                    f"{self.name}: this vLLM server cannot reload weights ({exc.message}); {_NO_DEV_MODE}",
                    status=exc.status,
                    backend=self.name,
                    retryable=False,
                ) from exc
            raise
        try:
            await self.http.request_text(
                "POST", COLLECTIVE_RPC, {"method": "reload_weights", "kwargs": {"weights_path": path}}
            )
            self.base_model, self.lora, self.model = base, None, base
            await self.reset_prefix_cache()
        finally:
            await self.http.request_json("POST", "/resume")

    async def reset_prefix_cache(self) -> None:
        """Drop every cached KV block (``POST /reset_prefix_cache``), so none computed
        with the weights before a load is reused after it; nothing with
        ``prefix_cache="off"``. Retried while vLLM answers ``{"success": false}`` (blocks
        still held), then ``LLMError``; a 404/405 (not in dev mode) is an ``LLMError``
        naming the fixes."""
        if self.prefix_cache == "off":
            return
        delay = RESET_BACKOFF
        for attempt in range(RESET_TRIES):
            try:
                reply = await self.http.request_json("POST", RESET_PREFIX_CACHE)
            except LLMError as exc:
                if exc.status in (404, 405):
                    raise LLMError(
                        f"{self.name}: the weights are loaded but this vLLM server cannot "
                        f"reset its prefix cache ({exc.message}), so later requests could "
                        f"reuse KV blocks computed with the previous weights; {_NO_RESET}",
                        status=exc.status,
                        backend=self.name,
                        retryable=False,
                    ) from exc
                raise
            if reset_succeeded(reply):
                return
            if attempt + 1 < RESET_TRIES:
                await asyncio.sleep(delay)
                delay *= 2
        raise LLMError(
            f"{self.name}: the weights are loaded but the server refused to reset "
            f"its prefix cache {RESET_TRIES} times (blocks still held by running "
            "requests?), so later requests could reuse KV blocks computed with the "
            "previous weights",
            backend=self.name,
            retryable=True,
        )

    def loaded_model(self) -> str | None:
        return self.model

    def adopt(self, lora: str | None) -> None:
        """Name ``lora`` in later requests (None: the base model again) without asking
        the server: another router loaded it there (a cluster's head for its nodes'
        replicas), or this router did before this backend was added."""
        if lora is None:
            if self.lora is not None:
                self.model = self.base_model  # None: read from /v1/models at the next request
            self.lora = None
            return
        if self.lora is None:
            self.base_model = self.base_model or self.model  # None: read when needed
        self.lora = self.model = lora

    async def _base(self) -> str | None:
        """The served model's own name: as known, else read from ``/v1/models`` (where an
        adopted adapter's card names it as its parent)."""
        if self.base_model is not None:
            return self.base_model
        if self.lora is None:
            return await self.served_model()
        reply = await self.http.request_json("GET", "/v1/models")
        base = base_of(reply, self.lora)
        if base is None:
            raise self.malformed(f"/v1/models (no base model for the adapter {self.lora!r})", reply)
        return base

    def parse_window(self, reply: Any) -> Any:
        """A LoRA adapter's card in ``/v1/models`` has no ``max_model_len``: read the
        base model's."""
        if self.lora is None:
            return super().parse_window(reply)
        try:
            cards = [c for c in reply["data"] if isinstance(c, dict)]
        except (KeyError, TypeError):
            return None
        base = self.base_model or base_of(reply, self.lora)
        named = [c for c in cards if c.get("id") == base]
        return named[0].get("max_model_len") if named else None

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        if self.endpoint != "completions":
            info["endpoint"] = self.endpoint
        if self.prefix_cache != "reset":
            info["prefix_cache"] = self.prefix_cache
        if self.lora is not None:
            info["lora"] = self.lora
            info["base_model"] = self.base_model
        return info

    # --- replies -----------------------------------------------------------------
    def _parse_completion(self, reply: Any, prompt_ids: list[int]) -> Generation:
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
            raise self.malformed("completion reply", reply, exc) from exc
        return self._generation(reply, choice, prompt_ids, output_ids, token_logprobs)

    def _parse_generate(self, reply: Any, prompt_ids: list[int]) -> Generation:
        try:
            choice = reply["choices"][0]
            output_ids = [int(t) for t in choice["token_ids"]]
            content = (choice.get("logprobs") or {}).get("content")
            if content is None:
                raise ValueError("no logprobs.content in the reply")
            token_logprobs = [float(entry["logprob"]) for entry in content]
            logprob_ids = [int(entry["token_id"]) for entry in content]
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            raise self.malformed("generate reply", reply, exc) from exc
        if logprob_ids != output_ids[: len(logprob_ids)]:
            raise self.inconsistent("the logprobs' token ids differ from the sampled ids")
        gen = self._generation(reply, choice, prompt_ids, output_ids, token_logprobs)
        if choice.get("weight_versions"):
            gen.meta["weight_versions"] = choice["weight_versions"]
        return gen

    def _generation(
        self, reply: dict, choice: dict, prompt_ids: list[int], output_ids: list[int], token_logprobs: list[float]
    ) -> Generation:
        if len(output_ids) != len(token_logprobs):
            raise self.inconsistent(f"reply has {len(output_ids)} token ids but {len(token_logprobs)} logprobs")
        echoed = choice.get("prompt_token_ids", reply.get("prompt_token_ids"))
        if echoed is not None and echoed != prompt_ids:
            # The server saw different ids than we sent: every token after is suspect.
            raise self.inconsistent("the server's prompt_token_ids differ from the prompt sent")
        usage = reply.get("usage") or {}
        return Generation(
            output_ids=output_ids,
            logprobs=token_logprobs,
            finish_reason=choice.get("finish_reason") or "abort",
            backend=self.name,
            meta={
                "request_id": reply.get("id", reply.get("request_id")),
                "stop_reason": choice.get("stop_reason"),
                "prompt_tokens": usage.get("prompt_tokens"),
            },
        )

    # --- HTTP (a seam for tests) ---------------------------------------------------
    async def _post_json(self, path: str, body: dict) -> Any:
        return await self.http.request_json("POST", path, body)


def reset_succeeded(reply: Any) -> bool:
    """vLLM 0.32 answers ``{"success": bool}``; older servers an empty 200 (None here:
    a reset that always took place)."""
    return reply is None or (isinstance(reply, dict) and reply.get("success") is True)


def base_of(reply: Any, lora: str) -> str | None:
    """The base model in a ``/v1/models`` reply: the parent of ``lora``'s card, else the
    one card that has no parent (vLLM lists an adapter with its base as ``parent``)."""
    try:
        cards = [c for c in reply["data"] if isinstance(c, dict)]
    except (KeyError, TypeError):
        return None
    parents = [c.get("parent") for c in cards if c.get("id") == lora]
    if parents and isinstance(parents[0], str):
        return parents[0]
    roots = [c.get("id") for c in cards if c.get("parent") is None]
    return roots[0] if len(roots) == 1 and isinstance(roots[0], str) else None


def completions_body(model: str | None, prompt_ids: list[int], sampling: SamplingParams) -> dict:
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
    body.update(_optional(sampling))
    return body


def generate_body(model: str | None, prompt_ids: list[int], sampling: SamplingParams) -> dict:
    params: dict[str, Any] = {
        "max_tokens": sampling.max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "logprobs": 0,
        "detokenize": False,  # ids only: nothing is turned into text on the server
    }
    params.update(_optional(sampling))
    return {
        "model": model,
        "token_ids": prompt_ids,
        "sampling_params": params,
        "stream": False,
        "return_token_ids": True,
    }


def _optional(sampling: SamplingParams) -> dict:
    out: dict[str, Any] = {}
    if sampling.top_k > 0:
        out["top_k"] = sampling.top_k
    if sampling.seed is not None:
        out["seed"] = sampling.seed
    if sampling.stop_token_ids:
        out["stop_token_ids"] = list(sampling.stop_token_ids)
    return out


def _id_from_token(token: Any) -> int:
    """``"token_id:42"`` (vLLM's ``return_tokens_as_token_ids``) -> 42."""
    if isinstance(token, str) and token.startswith("token_id:"):
        return int(token[len("token_id:") :])
    raise ValueError(
        f"no token_ids in the reply and token {token!r} is not 'token_id:N' "
        "(is this a vLLM server with return_token_ids or return_tokens_as_token_ids?)"
    )
