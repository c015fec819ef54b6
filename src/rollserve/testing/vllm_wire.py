"""vLLM 0.32's OpenAI-server wire format, as FakeVLLM writes it.

(Shapes checked against a real vLLM 0.32 CPU server: see shared/REAL_VLLM.md.)
"""

from __future__ import annotations

import itertools
import time
import uuid
from typing import Any

from aiohttp import web

from rollserve.llm.tokens import ChatTokenizer


def parse_prompt(prompt: Any, tok: ChatTokenizer) -> list[int] | None:
    """A completion prompt as ids: a string, a list of ids, or a list of one such list."""
    if isinstance(prompt, str):
        return tok.encode(prompt)
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        return prompt
    return None


def completion_body(
    tok: ChatTokenizer,
    request: dict[str, Any],
    model: str,
    prompt_ids: list[int],
    output_ids: list[int],
    logprobs: list[float],
    finish: str,
    stop_reason: int | None,
    return_token_ids_supported: bool = True,
) -> dict[str, Any]:
    """The JSON body of a non-streamed ``/v1/completions`` answer with one choice."""
    # Like vLLM, the text leaves out the stop token that ended the sequence.
    text_ids = output_ids[:-1] if finish == "stop" else output_ids
    text = tok.decode(text_ids, skip_special_tokens=request.get("skip_special_tokens", True))
    return_ids = bool(request.get("return_token_ids")) and return_token_ids_supported
    choice: dict[str, Any] = {
        "index": 0,
        "text": text,
        "logprobs": None,
        "finish_reason": finish,
        "stop_reason": stop_reason,
        "prompt_logprobs": None,
        "prompt_token_ids": prompt_ids if return_ids else None,
        "token_ids": output_ids if return_ids else None,
        "routed_experts": None,
    }
    if request.get("logprobs") is not None:
        if request.get("return_tokens_as_token_ids"):
            tokens = [f"token_id:{t}" for t in output_ids]
        else:
            tokens = tok.hf.batch_decode([[t] for t in output_ids])
        choice["logprobs"] = {
            "text_offset": list(itertools.accumulate((len(t) for t in tokens[:-1]), initial=0)) if tokens else [],
            "token_logprobs": logprobs,
            "tokens": tokens,
            # vLLM 0.32 with logprobs=0 lists the sampled token alone at each step.
            "top_logprobs": [{token: lp} for token, lp in zip(tokens, logprobs)],
        }
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": request.get("model") or model,
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": "rollserve-fake-vllm",
        "usage": {
            "prompt_tokens": len(prompt_ids),
            "total_tokens": len(prompt_ids) + len(output_ids),
            "completion_tokens": len(output_ids),
            "prompt_tokens_details": None,
            "completion_tokens_details": None,
        },
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }


def error_response(status: int, message: str, kind: str = "BadRequestError", param: str | None = None) -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": kind, "param": param, "code": status}},
        status=status,
    )


def context_refusal(prompt_len: int, max_model_len: int, tokenized_here: bool = False) -> web.Response | None:
    """vLLM 0.32's answer to a prompt the context cannot take with one more token, or
    None: a prompt longer than ``max_model_len`` is refused by the renderer
    (``_token_len_check``); one of exactly ``max_model_len`` gets ``max_tokens`` cut to
    0 (``get_max_tokens``), which ``SamplingParams`` refuses. The messages are
    ``str(VLLMValidationError)``, its parameter and value appended; text the server
    tokenizes itself (``tokenized_here``: chat messages) is cut at ``max_model_len`` + 1
    tokens first, so it reports "at least" that many (as a token prompt of exactly that
    length does). Checked against a real vLLM 0.32 CPU server."""
    if prompt_len > max_model_len:
        count = min(prompt_len, max_model_len + 1) if tokenized_here else prompt_len
        qualifier = "at least " if count == max_model_len + 1 else ""
        return error_response(
            400,
            (
                f"This model's maximum context length is {max_model_len} tokens. However, your "
                f"prompt contains {qualifier}{count} input tokens, which exceeds this limit even "
                f"without any output tokens. Please reduce the length of the input prompt. "
                f"(parameter=input_tokens, value={count})"
            ),
            param="input_tokens",
        )
    if prompt_len == max_model_len:
        return error_response(
            400, "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)", param="max_tokens"
        )
    return None
