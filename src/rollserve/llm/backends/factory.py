"""Backends from specs: what a user writes on the command line or posts to the API.

    embedded                          the in-process SmolLM2 model
    embedded=/path/model.gguf         another GGUF, in-process
    http://host:8000                  a vLLM server
    vllm=http://host:8000             the same, explicitly
    sglang=http://host:30000          an SGLang server (/generate)
    llamacpp=http://host:8080         a llama.cpp server (/completion)
    openai_chat=https://api.openai.com   a chat API (message level, not trainable)
    {"kind": "vllm", "url": "http://host:8000", "name": "gpu0", "model": "policy",
     "endpoint": "auto", "weight": 2}

Over HTTP (``POST /v1/llm/backends``, ProRL's ``/add_llm_server``) only servers are
registered, by URL (``RemoteBackendSpec``): an embedded backend loads a model file
from the server's own disk into its process, so only the command line may start one.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rollserve.llm.backends.server_backend import ServerBackend
from rollserve.llm.base import LLMBackend

KINDS = ("vllm", "sglang", "llamacpp", "openai_chat", "embedded")
SERVER_KINDS = ("vllm", "sglang", "llamacpp", "openai_chat")


class BackendSpec(BaseModel):
    """One inference backend, as the API accepts it."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["vllm", "sglang", "llamacpp", "openai_chat", "embedded"] = Field(
        "vllm", description="vllm, sglang or llamacpp (token level), openai_chat (a chat API: "
        "message level, not trainable), or embedded (the in-process model)")
    url: str | None = Field(None, description="base URL of the server (all but embedded)")
    name: str | None = Field(None, description="unique name; derived from the URL if unset")
    model: str | None = Field(None, description="served model name; the server's first if unset")
    api_key: str | None = Field(None, description="sent as a bearer token")
    model_path: str | None = Field(None, description="GGUF file (embedded); SmolLM2 if unset")
    n_ctx: int = Field(4096, ge=128, le=1_000_000, description="context length (embedded)")
    timeout: float = Field(600.0, gt=0, description="seconds per request (servers)")
    endpoint: Literal["completions", "generate", "auto"] = Field(
        "completions", description="vllm: /v1/completions, /inference/v1/generate, or try both")
    weight: float = Field(1.0, gt=0, le=1000, description="routing weight (relative capacity)")


EMBEDDED_OVER_HTTP = ("an embedded backend loads a model file from the server's disk into its "
                      "process, so only the command line starts one (rollserve serve --backend "
                      "embedded[=PATH]); over HTTP, register an inference server by its URL")


class RemoteBackendSpec(BaseModel):
    """An inference server registered at runtime (over HTTP): by URL, never a path."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["vllm", "sglang", "llamacpp", "openai_chat"] = Field(
        "vllm", description="the server's kind: vllm, sglang or llamacpp (token level), or "
        "openai_chat (a chat API: message level, not trainable); embedded is command-line only")
    url: str = Field(..., min_length=8, max_length=2048, pattern=r"^https?://[!-~]+$",
                     description="base URL of the server (http:// or https://, ASCII)")
    name: str | None = Field(None, min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._:@+=-]+$",
                             description="unique name; derived from the URL if unset")
    model: str | None = Field(None, max_length=1000,
                              description="served model name; the server's first if unset")
    api_key: str | None = Field(None, max_length=10_000, pattern=r"^[!-~]+$",
                                description="sent as a bearer token (printable ASCII)")
    timeout: float = Field(600.0, gt=0, le=86_400, description="seconds per request")
    endpoint: Literal["completions", "generate", "auto"] = Field(
        "completions", description="vllm: /v1/completions, /inference/v1/generate, or try both")
    weight: float = Field(1.0, gt=0, le=1000, description="routing weight (relative capacity)")

    @field_validator("kind", mode="before")
    @classmethod
    def _no_embedded(cls, kind: Any) -> Any:
        if kind == "embedded":
            raise ValueError(EMBEDDED_OVER_HTTP)
        return kind

    def spec(self) -> BackendSpec:
        return BackendSpec.model_validate(self.model_dump(exclude_none=True))


def remote_spec(spec: str | dict | BackendSpec) -> BackendSpec:
    """``spec`` if it names an inference server by URL; ``ValueError`` for an embedded one."""
    parsed = parse_backend_spec(spec)
    if parsed.kind not in SERVER_KINDS:
        raise ValueError(f"kind: {EMBEDDED_OVER_HTTP}")
    return parsed


def parse_backend_spec(spec: str | dict | BackendSpec) -> BackendSpec:
    if isinstance(spec, BackendSpec):
        return spec
    if isinstance(spec, dict):
        kind = spec.get("kind", "vllm")
        if kind not in KINDS:
            raise ValueError(f"kind: unknown backend kind {kind!r}; expected one of {', '.join(KINDS)}")
        return BackendSpec.model_validate(spec)
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError("spec: expected 'embedded', a URL, 'KIND=VALUE' or a dict")
    text = spec.strip()
    if text == "embedded":
        return BackendSpec(kind="embedded")
    if text.startswith(("http://", "https://")):
        return BackendSpec(kind="vllm", url=text)
    kind, sep, value = text.partition("=")
    if not sep:
        raise ValueError(f"spec: {text!r} is not 'embedded', a URL, or 'KIND=VALUE'")
    if kind in SERVER_KINDS:
        return BackendSpec(kind=kind, url=value)
    if kind == "embedded":
        return BackendSpec(kind="embedded", model_path=value or None)
    raise ValueError(f"kind: unknown backend kind {kind!r}; expected one of {', '.join(KINDS)}")


def backend_from_spec(spec: str | dict | BackendSpec) -> LLMBackend:
    """Build the backend a spec describes (nothing is contacted yet)."""
    parsed = parse_backend_spec(spec)
    if parsed.kind == "embedded":
        from rollserve.llm.backends.embedded import EmbeddedBackend

        backend = EmbeddedBackend(
            model_path=parsed.model_path, n_ctx=parsed.n_ctx, name=parsed.name or "embedded"
        )
        backend.weight = parsed.weight
        return backend
    if not parsed.url:
        raise ValueError(f"url: a {parsed.kind} backend needs the server's URL")
    from rollserve.llm.backends.llamacpp_server import LlamaCppServerBackend
    from rollserve.llm.backends.openai_chat import OpenAIChatBackend
    from rollserve.llm.backends.sglang import SGLangBackend
    from rollserve.llm.backends.vllm import VLLMBackend

    if parsed.kind == "vllm":
        return VLLMBackend(parsed.url, name=parsed.name, model=parsed.model, api_key=parsed.api_key,
                           timeout=parsed.timeout, weight=parsed.weight, endpoint=parsed.endpoint)
    servers: dict[str, type[ServerBackend]] = {
        "sglang": SGLangBackend, "llamacpp": LlamaCppServerBackend, "openai_chat": OpenAIChatBackend}
    return servers[parsed.kind](parsed.url, name=parsed.name, model=parsed.model,
                                api_key=parsed.api_key, timeout=parsed.timeout, weight=parsed.weight)
