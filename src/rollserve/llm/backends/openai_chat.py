"""An OpenAI-compatible chat API (API models, or servers that cannot take tokens).

Message level: ``POST /v1/chat/completions`` with the conversation; the reply is
text (and tool calls), with no token ids we could train on, so the backend is
``trainable = False`` and the agent loop keeps a chat-only trajectory for it
(``trajectory.trainable: false`` in the result). ``generate`` on token ids is
refused with a non-retryable error.

``url`` is the server root (``https://api.openai.com`` or ``http://host:8000``);
a trailing ``/v1`` is accepted too. Health is ``GET /v1/models`` (OpenAI itself
has no ``/health``).
"""

from __future__ import annotations

from typing import Any

from rollserve.errors import LLMError
from rollserve.llm.backends.server_backend import ServerBackend
from rollserve.llm.base import ChatReply, Generation, Message, SamplingParams, ToolSchema


class OpenAIChatBackend(ServerBackend):
    kind = "openai_chat"
    trainable = False
    health_path = "/v1/models"
    window_path = None  # messages are not counted here: the loop reads the usage instead

    def __init__(self, url: str, *args: Any, **kwargs: Any):
        url = url.rstrip("/")
        if url.endswith("/v1"):
            url = url[: -len("/v1")]
        super().__init__(url, *args, **kwargs)

    async def _generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        raise LLMError(
            f"{self.name}: a message-level chat API cannot sample from token ids", backend=self.name, retryable=False
        )

    async def chat(
        self, messages: list[Message], sampling: SamplingParams, tools: list[ToolSchema] | None = None
    ) -> ChatReply:
        model = await self.served_model()
        self.outstanding += 1
        try:
            async with self.http.sampling_slot():  # the bounded connection pool, as generate
                reply = await self.http.request_json(
                    "POST", "/v1/chat/completions", request_body(model, messages, sampling, tools)
                )
        finally:
            self.outstanding -= 1
        try:
            choice = reply["choices"][0]
            message = choice["message"]
            content = message.get("content") or ""
            tool_calls = list(message.get("tool_calls") or [])
            finish = choice.get("finish_reason") or "stop"
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            raise self.malformed("chat completion", reply, exc) from exc
        return ChatReply(
            content=content,
            finish_reason=finish,
            tool_calls=tool_calls,
            backend=self.name,
            usage=dict(reply.get("usage") or {}),
        )


def request_body(
    model: str | None, messages: list[Message], sampling: SamplingParams, tools: list[ToolSchema] | None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "max_completion_tokens": sampling.max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "n": 1,
        "stream": False,
    }
    if sampling.seed is not None:
        body["seed"] = sampling.seed
    if tools:
        body["tools"] = tools
    return body
