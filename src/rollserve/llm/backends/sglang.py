"""An SGLang server as a backend: ``POST /generate`` with token ids.

Request: ``input_ids`` and ``sampling_params`` (``max_new_tokens``, not
``max_tokens``), ``return_logprob`` with ``logprob_start_len: -1`` (output tokens
only). Reply: ``output_ids`` and ``meta_info.output_token_logprobs``, a list of
``[logprob, token_id, text]`` (text null unless asked for), and
``meta_info.finish_reason`` = ``{"type": "stop", "matched": id}`` |
``{"type": "length", "length": n}`` | ``{"type": "abort", "message": ...}``.

We check that the ids inside the logprob triples are the sampled ids, and read the
ids from them when a server leaves ``output_ids`` out. SGLang's logprobs are those
of the distribution it sampled from (temperature applied unless the server runs
with ``SGLANG_RETURN_ORIGINAL_LOGPROB``): we pass them on verbatim.

Around a weight update the router may forward ``POST /pause_generation {mode}``
and ``POST /continue_generation``. New full weights (``LoadsWeights``):
``POST /update_weights_from_disk {"model_path": DIR, "weight_version": "K"}``
(SGLang answers ``{"success", "message", ...}``, a 400 when it failed); the policy
version becomes SGLang's ``weight_version``, which its replies carry in
``meta_info``. LoRA adapters are not loaded on SGLang (yet).
"""

from __future__ import annotations

from typing import Any, ClassVar

from rollserve.errors import LLMError
from rollserve.llm.backends.http import excerpt
from rollserve.llm.backends.server_backend import ServerBackend
from rollserve.llm.base import (
    Generation,
    LoadsWeights,
    Pausable,
    PauseMode,
    SamplingParams,
    WeightsKind,
)

_PAUSE_MODES = {"finish": "in_place", "abort": "abort"}  # ours -> SGLang's
_FINISH = {"stop": "stop", "length": "length", "abort": "abort"}


class SGLangBackend(ServerBackend, Pausable, LoadsWeights):
    kind = "sglang"
    window_slack = 1  # SGLang refuses input + max_new_tokens >= its context length
    weight_kinds: ClassVar[frozenset[WeightsKind]] = frozenset({"full"})

    async def _generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        reply = await self.http.request_json("POST", "/generate", request_body(prompt_ids, sampling))
        return self._parse(reply, prompt_ids)

    async def pause(self, mode: PauseMode = "finish") -> None:
        await self.http.request_json("POST", "/pause_generation", {"mode": _PAUSE_MODES.get(mode, mode)})

    async def resume(self) -> None:
        await self.http.request_json("POST", "/continue_generation", {})

    async def load_lora(self, name: str, path: str) -> None:
        raise LLMError(
            f"{self.name}: rollserve loads LoRA adapters into vLLM servers only; give SGLang full weights",
            backend=self.name,
            retryable=False,
        )

    async def load_full(self, path: str, policy_version: int | None = None) -> None:
        """``/update_weights_from_disk``; SGLang's ``weight_version`` becomes the policy
        version."""
        body: dict[str, Any] = {"model_path": path}
        if policy_version is not None:
            body["weight_version"] = str(policy_version)
        reply = await self.http.request_json("POST", "/update_weights_from_disk", body)
        if not isinstance(reply, dict) or reply.get("success") is not True:
            raise LLMError(
                f"{self.name}: /update_weights_from_disk did not succeed: {excerpt(reply)}",
                backend=self.name,
                retryable=False,
            )

    def loaded_model(self) -> str | None:
        return self.model

    def adopt(self, lora: str | None) -> None:
        """Full weights keep the model's name: nothing to adopt; an adapter is refused."""
        if lora is not None:
            raise LLMError(
                f"{self.name}: rollserve names LoRA adapters on vLLM servers only", backend=self.name, retryable=False
            )

    def _parse(self, reply: Any, prompt_ids: list[int]) -> Generation:
        try:
            meta = reply["meta_info"]
            triples = meta["output_token_logprobs"]
            logprobs = [float(t[0]) for t in triples]
            logprob_ids = [int(t[1]) for t in triples]
            output_ids = reply.get("output_ids")
            output_ids = logprob_ids if output_ids is None else [int(t) for t in output_ids]
            finish = meta.get("finish_reason")
            finish_type = finish.get("type") if isinstance(finish, dict) else finish
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            raise self.malformed("/generate reply", reply, exc) from exc
        if logprob_ids != output_ids:
            raise self.inconsistent("the ids in output_token_logprobs differ from output_ids")
        prompt_tokens = meta.get("prompt_tokens")
        if prompt_tokens is not None and prompt_tokens != len(prompt_ids):
            raise self.inconsistent(f"the server counted {prompt_tokens} prompt tokens, {len(prompt_ids)} were sent")
        return Generation(
            output_ids=output_ids,
            logprobs=logprobs,
            finish_reason=_FINISH.get(str(finish_type), "abort"),
            backend=self.name,
            meta={
                "request_id": meta.get("id"),
                "finish": finish,
                "prompt_tokens": prompt_tokens,
                "cached_tokens": meta.get("cached_tokens"),
                "weight_version": meta.get("weight_version"),
            },
        )


def request_body(prompt_ids: list[int], sampling: SamplingParams) -> dict:
    params: dict[str, Any] = {
        "max_new_tokens": sampling.max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k if sampling.top_k > 0 else -1,
        "skip_special_tokens": False,
        "no_stop_trim": True,
    }
    if sampling.stop_token_ids:
        params["stop_token_ids"] = list(sampling.stop_token_ids)
    if sampling.seed is not None:
        params["sampling_seed"] = sampling.seed
    return {
        "input_ids": prompt_ids,
        "sampling_params": params,
        "return_logprob": True,
        "logprob_start_len": -1,  # no prompt logprobs: only the sampled tokens'
        "top_logprobs_num": 0,
        "return_text_in_logprobs": False,
        "stream": False,
    }
