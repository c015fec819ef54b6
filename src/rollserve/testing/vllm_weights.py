"""What FakeVLLM answers about new weights: vLLM's runtime LoRA loading
(``/v1/load_lora_adapter``, ``/v1/unload_lora_adapter``) and dev mode's
``/collective_rpc`` with ``reload_weights`` and ``/reset_prefix_cache``, in vLLM 0.32's
words and shapes; and its prefix cache, which outlives a weight load.

The prefix cache, as vLLM 0.32 keys it: a block of prompt tokens under a model name
and (for an adapter) its path, never the weights themselves. The double caches the
first ``PREFIX_BLOCK`` prompt tokens of each request; a later request with the same
first block, model name and adapter path reuses it and samples from the weights that
block was computed with (a simplification: on vLLM only the cached positions are
stale). So after an in-place reload from the same path, or ``reload_weights``, the
old weights go on sampling until the cache is reset (``/reset_prefix_cache``, or a
``/pause`` that clears it, as vLLM 0.32's ``clear_cache`` default does)."""

from __future__ import annotations

import os

from aiohttp import web

from rollserve.testing.fake_server import read_json
from rollserve.testing.vllm_wire import error_response

PREFIX_BLOCK = 16  # tokens per KV block (vLLM's default block size)
CacheKey = tuple[str, str, tuple[int, ...]]  # (model name, adapter path, first block)


class RuntimeWeights:
    """Weights loaded at run time, and what a request naming a model samples from."""

    model: str
    lora_adapters: dict[str, str]  # name -> path, as loaded
    full_weights: str | None  # the folder of the last reload_weights
    weight_loads: list[tuple[str, str]]  # ("lora:NAME" | "full", path), in order
    prefix_caching: bool  # as vLLM's default; False: --no-enable-prefix-caching
    prefix_cache: dict[CacheKey, str]  # a cached first block -> the weights it was computed with
    prefix_cache_resets: int  # /reset_prefix_cache calls that emptied the cache
    prefix_cache_refusals: int  # /reset_prefix_cache calls refused (requests running)
    holding: dict[int, web.Request]  # requests sampling now, by id() (their KV blocks in use)

    def init_weights(self, prefix_caching: bool = True) -> None:
        self.lora_adapters = {}
        self.full_weights = None
        self.weight_loads = []
        self.prefix_caching = prefix_caching
        self.prefix_cache = {}
        self.prefix_cache_resets = 0
        self.prefix_cache_refusals = 0
        self.holding = {}

    def sampling_weights(self, model: str | None, prompt_ids: list[int]) -> str:
        """What a request naming ``model`` with ``prompt_ids`` samples from: the weights
        its first block was cached with, if cached (see the module docstring), else
        ``weights_of(model)`` (and the block is cached now)."""
        weights = self.weights_of(model)
        if not self.prefix_caching or len(prompt_ids) < PREFIX_BLOCK:
            return weights
        name = model if isinstance(model, str) else self.model
        key = (name, self.lora_adapters.get(name, ""), tuple(prompt_ids[:PREFIX_BLOCK]))
        return self.prefix_cache.setdefault(key, weights)

    def clear_prefix_cache(self) -> None:
        self.prefix_cache.clear()

    async def _reset_prefix_cache(self, request: web.Request) -> web.Response:
        """Dev mode's ``/reset_prefix_cache``: ``{"success": true}``, or, as vLLM 0.32
        does while running requests hold blocks, ``{"success": false}`` and nothing
        reset. A request whose client has gone holds none (vLLM aborts it)."""
        if any(r.transport is not None and not r.transport.is_closing() for r in self.holding.values()):
            self.prefix_cache_refusals += 1
            return web.json_response({"success": False})
        self.clear_prefix_cache()
        self.prefix_cache_resets += 1
        return web.json_response({"success": True})

    def weights_of(self, model: str | None) -> str:
        """What a request naming ``model`` samples from ("" for the weights as started)."""
        parts = []
        if self.full_weights is not None:
            parts.append(f"full:{self.full_weights}#{self._count('full')}")
        if model in self.lora_adapters:
            parts.append(f"lora:{model}:{self.lora_adapters[model]}#{self._count('lora:' + model)}")
        return "|".join(parts)

    def _count(self, kind: str) -> int:
        return sum(1 for k, _ in self.weight_loads if k == kind)

    async def _collective_rpc(self, request: web.Request) -> web.Response:
        """Dev mode's ``/collective_rpc``: ``reload_weights`` reads ``weights_path``
        (``{"results": [null]}``); a worker's exception is a 500 in vLLM's error shape."""
        body = await read_json(request, error_response)
        if isinstance(body, web.Response):
            return body
        method, kwargs = body.get("method"), body.get("kwargs") or {}
        if method is None:
            return web.json_response({"detail": "Missing 'method' in request body"}, status=400)
        path = kwargs.get("weights_path") if isinstance(kwargs, dict) else None
        if method != "reload_weights" or not isinstance(path, str) or not os.path.isdir(path):
            # vLLM 0.32: the worker's exception, in a 500 (the server stays up)
            return error_response(
                500,
                "Call to collective_rpc method failed: Worker failed "
                f"with error 'cannot load weights from {path!r}', please "
                "check the stack trace above for the root cause",
                kind="InternalServerError",
            )
        self.weight_loads.append(("full", path))
        self.full_weights = path
        return web.json_response({"results": [None]})

    async def _load_lora(self, request: web.Request) -> web.Response:
        """``/v1/load_lora_adapter``: a 200 in plain text; 400 for a name already loaded
        (unless ``load_inplace``), 404 for a folder with no adapter (vLLM 0.32's words: it
        hides the path)."""
        body = await read_json(request, error_response)
        if isinstance(body, web.Response):
            return body
        name, path = body.get("lora_name"), body.get("lora_path")
        if not name or not path or not isinstance(name, str) or not isinstance(path, str):
            return error_response(400, "Both 'lora_name' and 'lora_path' must be provided.", kind="InvalidUserInput")
        if not body.get("load_inplace") and name in self.lora_adapters:
            return error_response(
                400,
                f"The lora adapter '{name}' has already been loaded. If "
                "you want to load the adapter in place, set "
                "'load_inplace' to True.",
                kind="InvalidUserInput",
            )
        if not os.path.isfile(os.path.join(path, "adapter_config.json")):
            return error_response(404, f"Loading lora {name} failed: No adapter found for <path>", kind="NotFoundError")
        self.weight_loads.append((f"lora:{name}", path))
        self.lora_adapters[name] = path
        return web.Response(status=200, text=f"Success: LoRA adapter '{name}' added successfully.")

    async def _unload_lora(self, request: web.Request) -> web.Response:
        body = await read_json(request, error_response)
        if isinstance(body, web.Response):
            return body
        name = body.get("lora_name")
        if name not in self.lora_adapters:
            return error_response(404, f"The lora adapter '{name}' cannot be found.", kind="NotFoundError")
        del self.lora_adapters[name]
        return web.Response(status=200, text=f"Success: LoRA adapter '{name}' removed successfully.")
