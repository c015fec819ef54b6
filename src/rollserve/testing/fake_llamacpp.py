"""A scripted llama.cpp-server look-alike: ``/completion`` on token ids, no model.

The reply has the keys of llama.cpp's ``to_json_non_oaicompat`` (``content``,
``tokens``, ``stop_type``, ``tokens_evaluated``, ``completion_probabilities``, ...)
and reproduces its quirks that matter to a trainer:

- ``tokens`` (with ``return_tokens``) holds every sampled id, the end-of-generation
  token included; ``content`` leaves it out;
- ``completion_probabilities`` (only with ``n_probs`` > 0) has no entry for a token
  that leaves the text ending inside a UTF-8 character (llama.cpp adds a token's
  probabilities only once its text is complete), so it can be shorter than
  ``tokens``;
- entries carry ``logprob`` and ``top_logprobs``, or ``prob`` and ``top_probs``
  with ``post_sampling_probs``.

Also ``/health``, ``/props``, ``/v1/models`` and ``/tokenize``.
"""

from __future__ import annotations

import math
import time
from typing import Any

from aiohttp import web

from rollserve.testing.fake_server import FakeServer, RecordedCall, read_json

__all__ = ["FakeLlamaCpp"]

_STOP_TYPE = {"stop": "eos", "length": "limit", "abort": "none"}


def error_response(status: int, message: str, kind: str = "invalid_request_error") -> web.Response:
    return web.json_response({"error": {"code": status, "message": message, "type": kind}}, status=status)


class FakeLlamaCpp(FakeServer):
    thread_name = "fake-llamacpp"

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/completion", self._completion)
        app.router.add_post("/completions", self._completion)
        app.router.add_get("/health", self._health)
        app.router.add_get("/props", self._props)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/tokenize", self._tokenize)

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _props(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "default_generation_settings": {"n_ctx": self.max_model_len},
                "total_slots": self.capacity or 1,
                "model_path": self.model,
                "chat_template": self.tok.hf.chat_template,
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
                        "owned_by": "llamacpp",
                        "meta": {"n_ctx_train": self.max_model_len},
                    }
                ],
            }
        )

    async def _tokenize(self, request: web.Request) -> web.Response:
        body = await read_json(request, error_response)
        if isinstance(body, web.Response):
            return body
        return web.json_response({"tokens": self.tok.encode(str(body.get("content", "")))})

    async def _completion(self, request: web.Request) -> web.StreamResponse:
        body = await read_json(request, error_response)
        if isinstance(body, web.Response):
            return body
        call = self.record("/completion", body)
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            prompt_ids = self.tok.encode(prompt)
        elif isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
            prompt_ids = prompt
        else:
            return self._reject(call, '"prompt" must be a string, a list of tokens, or a mixed list')
        call.prompt_ids = prompt_ids
        n_ctx = self.max_model_len
        if len(prompt_ids) >= n_ctx:
            call.status, call.finished_at = 400, time.perf_counter()
            return web.json_response(
                {
                    "error": {
                        "code": 400,
                        "type": "exceed_context_size_error",
                        "message": "the request exceeds the available context size, try increasing it",
                        "n_prompt_tokens": len(prompt_ids),
                        "n_ctx": n_ctx,
                    }
                },
                status=400,
            )
        room = n_ctx - len(prompt_ids)
        n_predict = body.get("n_predict", -1)
        max_tokens = room if n_predict is None or n_predict < 0 else min(n_predict, room)
        status = self.take_failure(call)
        if status is not None:
            return await self.fail(request, call, status, lambda s, m: error_response(s, m, "server_error"))
        sampled = await self.run(call, prompt_ids, max_tokens, set(), bool(body.get("ignore_eos")), body.get("seed"))
        ids, logprobs = sampled.output_ids, sampled.logprobs
        content_ids = ids[:-1] if sampled.finish == "stop" else ids
        reply = {
            "index": 0,
            "content": self.tok.decode(content_ids, True),
            "tokens": list(ids) if body.get("return_tokens") else [],
            "id_slot": 0,
            "stop": True,
            "model": self.model,
            "tokens_predicted": len(ids),
            "tokens_evaluated": len(prompt_ids),
            "generation_settings": {
                "n_predict": n_predict,
                "seed": body.get("seed", -1),
                "temperature": body.get("temperature", 0.8),
                "n_probs": body.get("n_probs", 0),
            },
            "prompt": self.tok.decode(prompt_ids),
            "has_new_line": "\n" in self.tok.decode(ids),
            "truncated": sampled.finish == "length" and max_tokens == room,
            "stop_type": _STOP_TYPE[sampled.finish],
            "stopping_word": "",
            "tokens_cached": len(prompt_ids) + len(ids),
            "timings": {"prompt_n": len(prompt_ids), "predicted_n": len(ids)},
        }
        n_probs = int(body.get("n_probs") or 0)
        if n_probs > 0 and ids:
            reply["completion_probabilities"] = self._probabilities(
                ids, logprobs, bool(body.get("post_sampling_probs"))
            )
        return web.json_response(reply)

    def _probabilities(self, ids: list[int], logprobs: list[float], post_sampling: bool) -> list[dict[str, Any]]:
        out = []
        for i, (token, logprob) in enumerate(zip(ids, logprobs)):
            if self.tok.decode(ids[: i + 1]).endswith("\ufffd"):
                continue  # the text ends inside a UTF-8 character: llama.cpp records nothing
            piece = self.tok.decode([token])
            entry = {"id": token, "token": piece, "bytes": list(piece.encode())}
            if post_sampling:
                entry.update(prob=math.exp(logprob), top_probs=[{**entry, "prob": math.exp(logprob)}])
            else:
                entry.update(logprob=logprob, top_logprobs=[{**entry, "logprob": logprob}])
            out.append(entry)
        return out

    def _reject(self, call: RecordedCall, message: str) -> web.Response:
        call.status, call.finished_at = 400, time.perf_counter()
        return error_response(400, message)
