"""A llama.cpp server (``llama-server``) as a backend: ``POST /completion`` with token ids.

Request: ``prompt`` as a token array (llama.cpp adds no BOS to an all-ids prompt),
``n_predict``, ``return_tokens: true``, ``n_probs: 1`` and
``post_sampling_probs: false``. Reply (``server_task_result_cmpl_final::
to_json_non_oaicompat`` in tools/server): ``tokens`` (every sampled id, the final
end-of-generation token included), ``stop_type`` (``eos`` | ``word`` | ``limit`` |
``none``), ``tokens_evaluated`` (the prompt's length) and
``completion_probabilities``: one ``{id, token, bytes, logprob, top_logprobs}`` per
token, where ``logprob`` is the sampled token's log-probability under the model's
raw (pre-sampling) distribution, as vLLM reports it by default.

Two traps, both checked, neither papered over:

- llama.cpp records no probability for a token that leaves the text ending inside
  a UTF-8 character (a multi-byte character split over tokens), so the list can be
  shorter than ``tokens``. We align the two by id and, if any token has no
  logprob, fail the call (retryable: a new sample may not split a character)
  rather than invent one.
- llama.cpp's samplers default to top_k 40 and min_p 0.05; we send the neutral
  values (top_k 0, min_p 0, no penalties) so it samples what the request says.

llama.cpp has no ``stop_token_ids``: a stop token other than end-of-generation is
applied here, by cutting the reply after its first occurrence (the tokens up to
it are exactly what the model sampled, so the cut sample is a faithful one).
"""

from __future__ import annotations

from typing import Any

from rollserve.errors import LLMError
from rollserve.llm.backends.server_backend import ServerBackend
from rollserve.llm.base import Generation, SamplingParams

_FINISH = {"eos": "stop", "word": "stop", "limit": "length"}


class LlamaCppServerBackend(ServerBackend):
    kind = "llamacpp"
    models_path = None  # /completion needs no model name
    window_path = "/props"  # default_generation_settings.n_ctx: a slot's context

    def parse_window(self, reply: Any) -> Any:
        settings = reply.get("default_generation_settings") if isinstance(reply, dict) else None
        return settings.get("n_ctx") if isinstance(settings, dict) else None

    async def _generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        reply = await self.http.request_json("POST", "/completion", request_body(prompt_ids, sampling))
        gen = self._parse(reply, prompt_ids)
        return cut_at_stop(gen, sampling.stop_token_ids)

    def _parse(self, reply: Any, prompt_ids: list[int]) -> Generation:
        try:
            tokens = reply.get("tokens")
            if tokens is None:
                raise ValueError("no 'tokens' (a llama.cpp server too old for return_tokens?)")
            tokens = [int(t) for t in tokens]
            probs = reply.get("completion_probabilities") or []
            prob_ids = [int(p["id"]) for p in probs]
            if probs and "logprob" not in probs[0]:
                raise ValueError("completion_probabilities without 'logprob' (post_sampling_probs is on?)")
            prob_values = [float(p["logprob"]) for p in probs]
            stop_type = reply.get("stop_type")
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            raise self.malformed("/completion reply", reply, exc) from exc
        evaluated = reply.get("tokens_evaluated")
        if evaluated is not None and evaluated != len(prompt_ids):
            raise self.inconsistent(f"the server evaluated {evaluated} prompt tokens, {len(prompt_ids)} were sent")
        logprobs = align_logprobs(tokens, prob_ids, prob_values)
        if logprobs is None:
            raise LLMError(
                f"{self.name}: llama.cpp gave logprobs for {len(prob_ids)} of {len(tokens)} "
                "sampled tokens (it skips tokens that end inside a UTF-8 character); "
                "refusing to invent the missing ones",
                backend=self.name,
            )
        return Generation(
            output_ids=tokens,
            logprobs=logprobs,
            finish_reason=_FINISH.get(stop_type, "abort"),
            backend=self.name,
            meta={
                "stop_type": stop_type,
                "prompt_tokens": evaluated,
                "tokens_cached": reply.get("tokens_cached"),
                "id_slot": reply.get("id_slot"),
            },
        )


def align_logprobs(tokens: list[int], prob_ids: list[int], values: list[float]) -> list[float] | None:
    """One logprob per token, matched by id in order; None if any token has none."""
    if prob_ids == tokens:
        return values
    out: list[float] = []
    j = 0
    for token in tokens:
        if j < len(prob_ids) and prob_ids[j] == token:
            out.append(values[j])
            j += 1
        else:
            return None
    return out


def cut_at_stop(gen: Generation, stop_token_ids: list[int]) -> Generation:
    """End the reply at its first stop token (llama.cpp knows only its own EOG tokens)."""
    stops = set(stop_token_ids)
    for i, token in enumerate(gen.output_ids):
        if token in stops:
            if i + 1 < len(gen.output_ids) or gen.finish_reason != "stop":
                gen.output_ids = gen.output_ids[: i + 1]
                gen.logprobs = gen.logprobs[: i + 1]
                gen.finish_reason = "stop"
                gen.meta["stop_reason"] = token
            break
    return gen


def request_body(prompt_ids: list[int], sampling: SamplingParams) -> dict:
    body: dict[str, Any] = {
        "prompt": prompt_ids,
        "n_predict": sampling.max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k if sampling.top_k > 0 else 0,  # 0: off (default 40)
        "min_p": 0.0,  # default 0.05
        "typical_p": 1.0,
        "repeat_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "n_probs": 1,  # > 0, or there are no completion_probabilities at all
        "post_sampling_probs": False,  # logprobs of the raw distribution
        "return_tokens": True,
        "cache_prompt": True,
        "stream": False,
    }
    if sampling.seed is not None:
        body["seed"] = sampling.seed
    return body
