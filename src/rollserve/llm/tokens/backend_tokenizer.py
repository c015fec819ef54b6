"""The policy's tokenizer and chat template as the serving backend applies them.

``--tokenizer vllm:URL`` (or ``backend:URL``): instead of a local tokenizer folder or
GGUF, the vLLM server at URL renders and tokenizes, so rollserve needs no copy of
the model's files and uses exactly the template the server was started with:

- ``POST /tokenize {"messages", "add_generation_prompt", "tools"?}``: a conversation
  through the chat template, as ids (``tokens``);
- ``POST /tokenize {"prompt": text, "add_special_tokens": false}``: text as ids;
- ``POST /detokenize {"tokens"}``: ids as text (``prompt``), special tokens kept.

Everything is async (HTTP on the event loop, never blocking it); the agent loop uses
it through ``tokens.chat.BackendPromptBuilder``, which builds the same append-only
prompts from ids that ``LocalPromptBuilder`` builds from text. Two facts the loop
needs are probed once (``ready``: at server start, and on first use until it
succeeds): the end-of-turn token (the id the template writes after an assistant
message's content) and whether the template renders a ``tools`` argument
(``renders_tools``, read by ``agent.tool_calls``). Reading either before is a
``TokenizerError`` (infra: the rollout is masked, never given a prompt built some
other way). A server that cannot be reached is an ``LLMError`` (infra, masked).
"""

from __future__ import annotations

import asyncio

from rollserve.llm.backends.http import HTTPClient, host_port
from rollserve.llm.base import Message, TokenizerError, ToolSchema
from rollserve.llm.tokens.chat import BackendPromptBuilder

BACKEND_PREFIXES = ("vllm:", "backend:")
_PROBE_CONTENT = "rollserve probe 7431"
_PROBE_TOOL: list[ToolSchema] = [
    {
        "type": "function",
        "function": {"name": "probe_tool", "description": "d", "parameters": {"type": "object", "properties": {}}},
    }
]


def is_backend_source(source: str) -> bool:
    return source.startswith(BACKEND_PREFIXES)


class BackendTokenizer:
    """Render, encode and decode through a vLLM server's ``/tokenize`` and ``/detokenize``.

    Implements ``llm.base.Tokenizer`` and ``tokens.base.IdTemplate``.
    """

    def __init__(self, url: str, model: str | None = None, api_key: str | None = None, timeout: float = 60.0):
        # Unbounded: its calls take no sampling slot, so a bound would only queue them
        # inside aiohttp, where the wait would count against their 60 s timeout.
        self.http = HTTPClient(
            url, f"tokenizer@{host_port(url)}", api_key=api_key, timeout=timeout, max_connections=None
        )
        self.name = f"vllm:{self.http.base_url}"
        self.model = model
        self._renders_tools: bool | None = None  # known after ready()
        self._eos: int | None = None
        self._lock: asyncio.Lock | None = None
        self._lock_loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def from_source(cls, source: str) -> BackendTokenizer:
        """``vllm:http://host:8000`` or ``backend:http://host:8000``."""
        _, _, url = source.partition(":")
        try:
            return cls(url)
        except ValueError as exc:
            raise TokenizerError(f"tokenizer source {source!r}: {exc}") from exc

    # --- the probes ----------------------------------------------------------------
    @property
    def eos_token_id(self) -> int:
        """The end-of-turn token (``<|im_end|>`` for ChatML); known after ``ready()``."""
        if self._eos is None:
            raise TokenizerError(f"{self.name}: not probed yet; await ready() first")
        return self._eos

    @property
    def max_token_bytes(self) -> int | None:
        """Unknown: the vocabulary is the backend's."""
        return None

    @property
    def renders_tools(self) -> bool:
        """Whether the server's chat template renders ``tools``; known after ``ready()``."""
        if self._renders_tools is None:
            raise TokenizerError(f"{self.name}: not probed yet; await ready() first")
        return self._renders_tools

    async def ready(self) -> None:
        """Probe the server once (model name, end-of-turn token, tools support)."""
        if self._eos is not None:
            return
        loop = asyncio.get_running_loop()
        if self._lock is None or self._lock_loop is not loop:
            self._lock, self._lock_loop = asyncio.Lock(), loop
        async with self._lock:
            if self._eos is not None:
                return
            if self.model is None:
                models = await self.http.request_json("GET", "/v1/models")
                try:
                    self.model = str(models["data"][0]["id"])
                except (KeyError, IndexError, TypeError) as exc:
                    raise TokenizerError(f"{self.name}: /v1/models lists no model") from exc
            user: list[Message] = [{"role": "user", "content": "x"}]
            with_tools = await self.render_ids(user, True, tools=_PROBE_TOOL)
            renders_tools = with_tools != await self.render_ids(user, True)
            self._eos = await self._find_end_of_turn(user)
            self._renders_tools = renders_tools

    async def _find_end_of_turn(self, user: list[Message]) -> int:
        """The token the template writes right after an assistant message's content."""
        rendered = await self.render_ids(user + [{"role": "assistant", "content": _PROBE_CONTENT}], False)
        content = await self.encode(_PROBE_CONTENT)
        for start in range(len(rendered) - len(content)):
            if rendered[start : start + len(content)] == content:
                return rendered[start + len(content)]
        raise TokenizerError(
            f"{self.name}: could not find the end-of-turn token (the chat template does not "
            "write an assistant message's content verbatim); use a local tokenizer instead"
        )

    # --- rendering, encoding, decoding --------------------------------------------------
    def _body(self, **fields: object) -> dict[str, object]:
        return {"model": self.model, **fields} if self.model else fields

    async def render_ids(
        self, messages: list[Message], add_generation_prompt: bool, tools: list[ToolSchema] | None = None
    ) -> list[int]:
        """``messages`` through the chat template, as the server tokenizes them."""
        body = self._body(messages=messages, add_generation_prompt=add_generation_prompt, add_special_tokens=False)
        if tools:
            body["tools"] = tools
        return self._tokens(await self.http.request_json("POST", "/tokenize", body))

    async def encode(self, text: str) -> list[int]:
        """Ids of ``text`` as the template wrote it: special tokens parsed, none added."""
        body = self._body(prompt=text, add_special_tokens=False)
        return self._tokens(await self.http.request_json("POST", "/tokenize", body))

    async def decode(self, ids: list[int]) -> str:
        if not ids:
            return ""
        reply = await self.http.request_json("POST", "/detokenize", self._body(tokens=list(ids)))
        if not isinstance(reply, dict) or not isinstance(reply.get("prompt"), str):
            raise TokenizerError(f"{self.name}: /detokenize answered no 'prompt': {reply!r:.200}")
        return str(reply["prompt"])

    def _tokens(self, reply: object) -> list[int]:
        tokens = reply.get("tokens") if isinstance(reply, dict) else None
        if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
            raise TokenizerError(f"{self.name}: /tokenize answered no 'tokens': {reply!r:.200}")
        return tokens

    # --- llm.base.Tokenizer ---------------------------------------------------------------
    def prompt_builder(self, tools: list[ToolSchema] | None = None) -> BackendPromptBuilder:
        return BackendPromptBuilder(self, tools)

    async def close(self) -> None:
        await self.http.close()
