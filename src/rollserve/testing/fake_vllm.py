"""A scripted, vLLM-compatible HTTP server: test handlers and benchmarks without a GPU.

It speaks the subset of vLLM 0.32's server that rollserve uses: token-id prompts on
``/v1/completions`` with ``return_token_ids`` and ``logprobs``, ``/tokenize``,
``/detokenize``, ``/v1/models``, ``/health``, ``/v1/chat/completions`` (message
level), and, when asked for, the tokens-only ``/inference/v1/generate``
(``generate_endpoint=True``, as ``--enable-scale-out``), the dev-mode ``/pause``
``/resume`` ``/is_paused`` ``/collective_rpc`` and ``/reset_prefix_cache``
(``dev_mode=True``, as ``VLLM_SERVER_DEV_MODE=1``; ``reload_weights`` takes a
``weights_path`` folder; without dev mode they are 404s, as on vLLM),
and runtime LoRA loading ``/v1/load_lora_adapter`` ``/v1/unload_lora_adapter``
(``runtime_lora=True``, as ``--enable-lora`` with
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``). New weights change the logprobs
(``weights_of(model)`` says what a request naming ``model`` samples from, unless a
prefix cached before the load is reused: ``prefix_caching``, see
``rollserve.testing.vllm_weights``), and with
``runtime_lora`` a request naming a model the server does not serve is a 404, as on
vLLM (without it the double takes any model name).
Replies are scripted and tokenized with a real chat tokenizer; every call is recorded.

    async with FakeVLLM(tokenizer, replies=["4", "done"], latency=0.01) as server:
        backend = VLLMBackend(server.url)

    server = FakeVLLM(tokenizer).start_in_thread()   # for sync code
    ...; server.stop()

``capacity`` limits concurrent "slots" like a GPU server's max batch: requests beyond
it queue. ``stats()`` reports the busy fraction (wall time with at least one request
in a slot) and utilization (slot-seconds / (wall x capacity)).
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from typing import Any

from aiohttp import web

from rollserve.llm.tokens import DEFAULT_TOKENIZER, ChatTokenizer
from rollserve.testing.fake_server import (
    FakeServer,
    LatencyFn,
    RecordedCall,
    ReplyFn,
    Sampled,
    fake_logprob,
    read_json,
)
from rollserve.testing.vllm_weights import RuntimeWeights
from rollserve.testing.vllm_wire import (
    completion_body,
    context_refusal,
    error_response,
    parse_prompt,
)

__all__ = ["FakeVLLM", "RecordedCall", "fake_logprob", "main"]


class FakeVLLM(RuntimeWeights, FakeServer):
    """A scripted vLLM look-alike; see the module docstring.

    return_token_ids_supported: False imitates a server that ignores
        ``return_token_ids`` (ids only as "token_id:N" strings).
    max_model_len: the context window. As vLLM 0.32 does, ``max_tokens`` is cut to
        what the window leaves after the prompt, and a prompt that leaves nothing is
        refused with a 400 in vLLM's words. ``/v1/models`` reports it, unless
        ``report_max_model_len`` is False (a server or proxy that does not say).
    """

    thread_name = "fake-vllm"

    def __init__(
        self,
        tokenizer: ChatTokenizer | str = DEFAULT_TOKENIZER,
        replies: str | list[str] | tuple[str, ...] | ReplyFn = ("OK",),
        latency: float | LatencyFn = 0.0,
        model: str = "fake-model",
        capacity: int | None = None,
        max_model_len: int = 32768,
        return_token_ids_supported: bool = True,
        host: str = "127.0.0.1",
        port: int = 0,
        generate_endpoint: bool = False,
        dev_mode: bool = False,
        report_max_model_len: bool = True,
        runtime_lora: bool = False,
        prefix_caching: bool = True,
    ):
        super().__init__(tokenizer, replies, latency, model, capacity, max_model_len, host, port)
        self.return_token_ids_supported = return_token_ids_supported
        self.report_max_model_len = report_max_model_len
        self.generate_endpoint = generate_endpoint
        self.dev_mode = dev_mode
        self.runtime_lora = runtime_lora
        self.init_weights(prefix_caching)

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/detokenize", self._detokenize)
        if self.generate_endpoint:
            app.router.add_post("/inference/v1/generate", self._generate)
        if self.dev_mode:
            app.router.add_post("/pause", self._pause)
            app.router.add_post("/resume", self._resume)
            app.router.add_get("/is_paused", self._is_paused)
            app.router.add_post("/collective_rpc", self._collective_rpc)
            app.router.add_post("/reset_prefix_cache", self._reset_prefix_cache)
        if self.runtime_lora:
            app.router.add_post("/v1/load_lora_adapter", self._load_lora)
            app.router.add_post("/v1/unload_lora_adapter", self._unload_lora)

    # --- routes ----------------------------------------------------------------
    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _models(self, request: web.Request) -> web.Response:
        card = {
            "id": self.model,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "vllm",
            "root": self.model,
            "parent": None,
            "max_model_len": self.max_model_len if self.report_max_model_len else None,
        }
        loras = [
            {
                "id": name,
                "object": "model",
                "created": int(time.time()),
                "owned_by": "vllm",
                "root": path,
                "parent": self.model,
                "max_model_len": None,
            }
            for name, path in self.lora_adapters.items()
        ]
        return web.json_response({"object": "list", "data": [card, *loras]})

    async def _tokenize(self, request: web.Request) -> web.Response:
        body = await read_json(request, error_response)
        if isinstance(body, web.Response):
            return body
        if "messages" in body:
            text = self.tok.render(
                body["messages"], add_generation_prompt=body.get("add_generation_prompt", True), tools=body.get("tools")
            )
        elif isinstance(body.get("prompt"), str):
            text = body["prompt"]
        else:
            return error_response(400, "give 'prompt' (a string) or 'messages'")
        tokens = self.tok.encode(text)
        return web.json_response(
            {"count": len(tokens), "max_model_len": self.max_model_len, "tokens": tokens, "token_strs": None}
        )

    async def _detokenize(self, request: web.Request) -> web.Response:
        """vLLM's ``/detokenize``: ``{"tokens": [...]}`` in, ``{"prompt": text}`` out
        (special tokens kept)."""
        body = await read_json(request, error_response)
        if isinstance(body, web.Response):
            return body
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(type(t) is int and t >= 0 for t in tokens):
            return error_response(400, "tokens: expected a list of token ids")
        return web.json_response({"prompt": self.tok.decode(tokens)})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await read_json(request, error_response)
        if isinstance(body, web.Response):
            return body
        call = self.record("/v1/completions", body)
        unknown = self._unknown_model(call, body.get("model"))
        if unknown is not None:
            return unknown
        prompt_ids = parse_prompt(body.get("prompt"), self.tok)
        if prompt_ids is None:
            return self._reject(call, "prompt: expected a string, a list of token ids, or [[ids]]")
        sampled = await self._sample(request, call, prompt_ids, body, body.get("model"))
        if isinstance(sampled, web.StreamResponse):
            return sampled
        return web.json_response(
            completion_body(
                self.tok,
                body,
                self.model,
                prompt_ids,
                sampled.output_ids,
                sampled.logprobs,
                sampled.finish,
                sampled.stop_token,
                return_token_ids_supported=self.return_token_ids_supported,
            )
        )

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        """``/inference/v1/generate``, output_mode "tokens" (vLLM 0.32's shape)."""
        body = await read_json(request, error_response)
        if isinstance(body, web.Response):
            return body
        call = self.record("/inference/v1/generate", body)
        unknown = self._unknown_model(call, body.get("model"))
        if unknown is not None:
            return unknown
        prompt_ids = body.get("token_ids")
        params = body.get("sampling_params")
        if not (isinstance(prompt_ids, list) and prompt_ids and all(type(t) is int and t >= 0 for t in prompt_ids)):
            return self._reject(call, "token_ids: expected a non-empty list of token ids")
        if not isinstance(params, dict):
            return self._reject(call, "sampling_params: field required")
        sampled = await self._sample(request, call, prompt_ids, params, body.get("model"))
        if isinstance(sampled, web.StreamResponse):
            return sampled
        logprobs = None
        if params.get("logprobs") is not None:
            logprobs = {
                "content": [
                    {
                        "token_id": t,
                        "logprob": lp,
                        "rank": 1,
                        "top_logprobs": [{"token_id": t, "logprob": lp, "rank": 1}],
                    }
                    for t, lp in zip(sampled.output_ids, sampled.logprobs)
                ]
            }
        n = len(sampled.output_ids)
        choice = {
            "index": 0,
            "finish_reason": sampled.finish,
            "stop_reason": sampled.stop_token,
            "token_ids": sampled.output_ids,
            "routed_experts": None,
            "sampling_mask": None,
            "weight_versions": [{"version": "default", "start": 0, "end": n}] if n else None,
            "logprobs": logprobs,
        }
        return web.json_response(
            {
                "request_id": body.get("request_id") or uuid.uuid4().hex,
                "model": body.get("model") or self.model,
                "created": int(time.time()),
                "usage": {
                    "prompt_tokens": len(prompt_ids),
                    "total_tokens": len(prompt_ids) + len(sampled.output_ids),
                    "completion_tokens": len(sampled.output_ids),
                    "prompt_tokens_details": None,
                    "completion_tokens_details": None,
                },
                "prompt_logprobs": None,
                "prompt_token_id_logprobs": None,
                "prompt_token_ids": prompt_ids if body.get("return_token_ids") else None,
                "mm_placeholders": None,
                "metrics": None,
                "kv_transfer_params": None,
                "ec_transfer_params": None,
                "output_mode": "tokens",
                "choices": [choice],
            }
        )

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        """``/v1/chat/completions``: the messages rendered with the chat template."""
        body = await read_json(request, error_response)
        if isinstance(body, web.Response):
            return body
        call = self.record("/v1/chat/completions", body)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return self._reject(call, "messages: expected a non-empty list")
        prompt_ids = self.tok.encode(self.tok.render(messages, add_generation_prompt=True, tools=body.get("tools")))
        checked = await self._admit(
            request,
            call,
            prompt_ids,
            body.get("max_completion_tokens") or body.get("max_tokens") or 256,
            tokenized_here=True,
        )
        if not isinstance(checked, int):
            return checked
        max_tokens = checked
        sampled = await self.run(call, prompt_ids, max_tokens, set(), False, body.get("seed"))
        text_ids = sampled.output_ids[:-1] if sampled.finish == "stop" else sampled.output_ids
        message: dict[str, object] = {
            "role": "assistant",
            "content": self.tok.decode(text_ids, True),
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
            "tool_calls": [],
            "reasoning": None,
        }
        return web.json_response(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model") or self.model,
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "logprobs": None,
                        "finish_reason": sampled.finish,
                        "stop_reason": None,
                        "token_ids": None,
                    }
                ],
                "service_tier": None,
                "system_fingerprint": None,
                "prompt_logprobs": None,
                "prompt_token_ids": None,
                "kv_transfer_params": None,
                "usage": {
                    "prompt_tokens": len(prompt_ids),
                    "total_tokens": len(prompt_ids) + len(sampled.output_ids),
                    "completion_tokens": len(sampled.output_ids),
                    "prompt_tokens_details": None,
                },
            }
        )

    async def _pause(self, request: web.Request) -> web.Response:
        mode = request.query.get("mode", "abort")
        if mode not in ("abort", "wait", "keep"):
            return web.json_response({"error": f"invalid mode {mode!r}"}, status=400)
        self.pause("abort" if mode == "abort" else mode)
        if mode != "keep" and request.query.get("clear_cache", "true").lower() != "false":
            self.clear_prefix_cache()  # vLLM 0.32's clear_cache (deprecated) defaults to true
        return web.json_response({"status": "paused"})

    async def _resume(self, request: web.Request) -> web.Response:
        self.resume()
        return web.json_response({"status": "resumed"})

    async def _is_paused(self, request: web.Request) -> web.Response:
        return web.json_response({"is_paused": self.paused})

    # --- helpers -----------------------------------------------------------------
    def _unknown_model(self, call: RecordedCall, model: object) -> web.Response | None:
        """vLLM's 404 for a model it does not serve (checked with ``runtime_lora``)."""
        if (
            not self.runtime_lora
            or model is None
            or model == self.model
            or (isinstance(model, str) and model in self.lora_adapters)
        ):
            return None
        call.status, call.finished_at = 404, time.perf_counter()
        return error_response(404, f"The model `{model}` does not exist.", kind="NotFoundError", param="model")

    def _reject(self, call: RecordedCall, message: str) -> web.Response:
        call.status, call.finished_at = 400, time.perf_counter()
        return error_response(400, message)

    async def _sample(
        self, request: web.Request, call: RecordedCall, prompt_ids: list[int], params: dict[str, Any], model: Any
    ) -> Sampled | web.StreamResponse:
        """Admit the prompt (or answer instead, see ``_admit``), then sample it with the
        request's sampling ``params`` under the weights ``model`` names."""
        checked = await self._admit(request, call, prompt_ids, params.get("max_tokens") or 16)  # vLLM's default
        if not isinstance(checked, int):
            return checked
        self.holding[id(request)] = request
        try:
            return await self.run(
                call,
                prompt_ids,
                checked,
                set(params.get("stop_token_ids") or ()),
                bool(params.get("ignore_eos")),
                params.get("seed"),
                self.sampling_weights(model, prompt_ids),
            )
        finally:
            self.holding.pop(id(request), None)

    async def _admit(
        self,
        request: web.Request,
        call: RecordedCall,
        prompt_ids: list[int],
        max_tokens: int,
        tokenized_here: bool = False,
    ) -> web.StreamResponse | int:
        """The ``max_tokens`` to sample (cut, as vLLM 0.32 does, to what the context
        leaves), or the answer instead: a 400 for a prompt that leaves no room, or a
        scripted failure."""
        call.prompt_ids = prompt_ids
        refused = context_refusal(len(prompt_ids), self.max_model_len, tokenized_here)
        if refused is not None:
            call.status, call.finished_at = 400, time.perf_counter()
            return refused
        status = self.take_failure(call)
        if status is not None:
            return await self.fail(request, call, status, lambda s, m: error_response(s, m, kind="InternalServerError"))
        return min(max_tokens, self.max_model_len - len(prompt_ids))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m rollserve.testing.fake_vllm",
        description="A scripted vLLM-compatible server (no GPU, no model).",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds per call")
    replies = parser.add_mutually_exclusive_group()
    replies.add_argument("--reply", nargs="+", default=["OK"], help="replies, cycled")
    replies.add_argument(
        "--script",
        default=None,
        help="a Python file defining reply(prompt_ids, prompt) -> str: a "
        "per-rollout, multi-turn policy (see rollserve.testing.scripted_policy)",
    )
    parser.add_argument("--tokenizer", default=DEFAULT_TOKENIZER, help=f"folder, .gguf, or {DEFAULT_TOKENIZER}")
    parser.add_argument("--model", default="fake-model", help="served model name")
    parser.add_argument("--capacity", type=int, default=None, help="concurrent slots")
    parser.add_argument("--dev-mode", action="store_true", help="serve /pause, /resume, ... (VLLM_SERVER_DEV_MODE=1)")
    parser.add_argument(
        "--paused", action="store_true", help="start paused (implies --dev-mode): every call waits for POST /resume"
    )
    args = parser.parse_args(argv)
    script = None
    if args.script is not None:
        from rollserve.testing.scripted_policy import ScriptError, load_reply_script

        try:
            script = load_reply_script(args.script)
        except ScriptError as error:
            parser.error(f"--script: {error}")
    server = FakeVLLM(
        args.tokenizer,
        replies=script or args.reply,
        latency=args.latency,
        model=args.model,
        capacity=args.capacity,
        host=args.host,
        port=args.port,
        dev_mode=args.dev_mode or args.paused,
    )
    if args.paused:
        server.pause("wait")

    async def serve() -> None:
        async with server:
            print(f"fake vLLM serving {args.model!r} on {server.url}", flush=True)
            await asyncio.Event().wait()  # until Ctrl-C / SIGTERM

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
