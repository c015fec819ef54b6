"""A scripted SGLang-compatible server: ``/generate`` on token ids, no GPU, no model.

Speaks the part of SGLang's native API rollserve uses: ``POST /generate`` with
``input_ids``, ``sampling_params`` (``max_new_tokens``, ``stop_token_ids``, ...)
and ``return_logprob``; the reply carries ``output_ids`` and ``meta_info`` with
``output_token_logprobs`` as ``[logprob, token_id, null]`` triples and
``finish_reason`` as ``{"type": "stop", "matched": id}`` / ``{"type": "length",
"length": n}`` / ``{"type": "abort", ...}``. Also ``/health``,
``/health_generate``, ``/get_model_info``, ``/v1/models`` and
``/pause_generation {mode}`` / ``/continue_generation`` and
``/update_weights_from_disk {model_path, weight_version?}`` (a folder that exists;
new weights change the logprobs, and replies carry the ``weight_version``).

    async with FakeSGLang(tokenizer, replies=["4"]) as server:
        backend = SGLangBackend(server.url)
"""

from __future__ import annotations

import os
import time
import uuid

from aiohttp import web

from rollserve.testing.fake_server import FakeServer, RecordedCall, read_json

__all__ = ["FakeSGLang"]


def error_response(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "code": status}}, status=status)


class FakeSGLang(FakeServer):
    thread_name = "fake-sglang"
    weight_version = "default"
    model_path: str | None = None  # the folder of the last update_weights_from_disk
    weight_updates = 0

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/generate", self._generate)
        app.router.add_get("/health", self._health)
        app.router.add_get("/health_generate", self._health)
        app.router.add_get("/get_model_info", self._model_info)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/pause_generation", self._pause)
        app.router.add_post("/continue_generation", self._continue)
        app.router.add_post("/update_weights_from_disk", self._update_weights)

    def weights(self) -> str:
        """What requests sample from now ("" for the weights as started)."""
        return "" if self.model_path is None else f"full:{self.model_path}#{self.weight_updates}"

    async def _update_weights(self, request: web.Request) -> web.Response:
        body = await read_json(request, error_response)
        if isinstance(body, web.Response):
            return body
        path = body.get("model_path")
        if not isinstance(path, str) or not os.path.isdir(path):
            return web.json_response(
                {
                    "success": False,
                    "message": (f"Failed to get weights iterator: {path} (repository not found)."),
                    "num_paused_requests": 0,
                },
                status=400,
            )
        self.model_path, self.weight_updates = path, self.weight_updates + 1
        if body.get("weight_version") is not None:
            self.weight_version = str(body["weight_version"])
        return web.json_response(
            {"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": 0}
        )

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _model_info(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "model_path": self.model,
                "tokenizer_path": self.model,
                "is_generation": True,
                "weight_version": self.weight_version,
            }
        )

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.model,
                        "object": "model",
                        "created": int(time.time()),
                        "owned_by": "sglang",
                        "root": self.model,
                        "max_model_len": self.max_model_len,
                    }
                ],
            }
        )

    async def _pause(self, request: web.Request) -> web.Response:
        body = await read_json(request, error_response)
        if isinstance(body, web.Response):
            return body
        mode = body.get("mode", "abort")
        if mode not in ("abort", "retract", "in_place"):
            return error_response(400, f"Invalid mode: {mode!r}")
        self.pause(mode)
        return web.json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def _continue(self, request: web.Request) -> web.Response:
        self.resume()
        return web.json_response({"message": "Generation continued successfully.", "status": "ok"})

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await read_json(request, error_response)
        if isinstance(body, web.Response):
            return body
        call = self.record("/generate", body)
        prompt_ids: object
        if isinstance(body.get("text"), str) and "input_ids" not in body:
            prompt_ids = self.tok.encode(body["text"])
        else:
            prompt_ids = body.get("input_ids")
        if not (isinstance(prompt_ids, list) and prompt_ids and all(type(t) is int for t in prompt_ids)):
            return self._reject(call, "Either text or input_ids should be provided.")
        call.prompt_ids = prompt_ids
        params = body.get("sampling_params") or {}
        if "max_tokens" in params:  # SGLang's SamplingParams has no such field
            return self._reject(call, "SamplingParams.__init__() got an unexpected keyword argument 'max_tokens'")
        max_new = params.get("max_new_tokens", 128)
        if len(prompt_ids) + max_new > self.max_model_len:
            return self._reject(
                call,
                f"Requested token count exceeds the model's maximum context length of "
                f"{self.max_model_len} tokens. You requested a total of "
                f"{len(prompt_ids) + max_new} tokens: {len(prompt_ids)} tokens from the "
                f"input messages and {max_new} tokens for the completion.",
            )
        status = self.take_failure(call)
        if status is not None:
            return await self.fail(request, call, status, error_response)
        started = time.perf_counter()
        sampled = await self.run(
            call,
            prompt_ids,
            max_new,
            set(params.get("stop_token_ids") or ()),
            bool(params.get("ignore_eos")),
            params.get("sampling_seed"),
            self.weights(),
        )
        if sampled.finish == "stop":
            finish = {
                "type": "stop",
                "matched": sampled.stop_token if sampled.stop_token is not None else self.tok.eos_token_id,
            }
        elif sampled.finish == "length":
            finish = {"type": "length", "length": len(sampled.output_ids)}
        else:
            finish = {"type": "abort", "message": "Abort in waiting queue", "status_code": None, "err_type": None}
        text_ids = (
            sampled.output_ids[:-1]
            if sampled.finish == "stop" and not params.get("no_stop_trim")
            else sampled.output_ids
        )
        meta = {
            "id": body.get("rid") or uuid.uuid4().hex,
            "finish_reason": finish,
            "prompt_tokens": len(prompt_ids),
            "weight_version": self.weight_version,
            "total_retractions": 0,
            "completion_tokens": len(sampled.output_ids),
            "cached_tokens": 0,
            "e2e_latency": time.perf_counter() - started,
        }
        if body.get("return_logprob"):
            text = bool(body.get("return_text_in_logprobs"))
            pieces = (
                self.tok.hf.batch_decode([[t] for t in sampled.output_ids])
                if text
                else [None] * len(sampled.output_ids)
            )
            meta["input_token_logprobs"] = [[None, prompt_ids[-1], None]]
            meta["output_token_logprobs"] = [
                [lp, t, piece] for lp, t, piece in zip(sampled.logprobs, sampled.output_ids, pieces)
            ]
        return web.json_response(
            {
                "text": self.tok.decode(text_ids, params.get("skip_special_tokens", True)),
                "output_ids": sampled.output_ids,
                "meta_info": meta,
            }
        )

    def _reject(self, call: RecordedCall, message: str) -> web.Response:
        call.status, call.finished_at = 400, time.perf_counter()
        return error_response(400, message)
