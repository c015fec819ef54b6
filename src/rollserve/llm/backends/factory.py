"""Backends from specs: what a user writes on the command line or posts to the API.

    embedded                          the in-process SmolLM2 model
    embedded=/path/model.gguf         another GGUF, in-process
    http://host:8000                  a vLLM server
    vllm=http://host:8000             the same, explicitly
    sglang=http://host:30000          an SGLang server (/generate)
    llamacpp=http://host:8080         a llama.cpp server (/completion)
    openai_chat=https://api.openai.com   a chat API (message level, not trainable)
    {"kind": "vllm", "url": "http://host:8000", "name": "gpu0", "model": "policy",
     "endpoint": "auto", "weight": 2}   (a JSON object, on the command line too)

Every form becomes one of the spec models (``backends.specs``, a tagged union on
``kind``). Over HTTP (``POST /v1/llm/backends``, ProRL's ``/add_llm_server``) only
servers are registered, by URL (``RemoteBackendSpec``): an embedded backend loads a
model file from the server's own disk into its process, so only the command line may
start one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from pydantic import ValidationError

from rollserve.llm.backends.llamacpp_server import LlamaCppServerBackend
from rollserve.llm.backends.openai_chat import OpenAIChatBackend
from rollserve.llm.backends.server_backend import ServerBackend
from rollserve.llm.backends.sglang import SGLangBackend
from rollserve.llm.backends.specs import (
    EMBEDDED_OVER_HTTP,
    KINDS,
    SERVER_KINDS,
    AnySpec,
    BackendSpec,
    EmbeddedSpec,
    LlamaCppSpec,
    OpenAIChatSpec,
    RemoteBackendSpec,
    ServerSpec,
    SGLangSpec,
    VLLMSpec,
)
from rollserve.llm.backends.vllm import VLLMBackend
from rollserve.llm.base import LLMBackend

__all__ = [
    "EMBEDDED_OVER_HTTP",
    "KINDS",
    "SERVER_KINDS",
    "AnySpec",
    "BackendSpec",
    "BackendSpecError",
    "EmbeddedSpec",
    "LlamaCppSpec",
    "OpenAIChatSpec",
    "RemoteBackendSpec",
    "SGLangSpec",
    "ServerSpec",
    "VLLMSpec",
    "backend_from_spec",
    "parse_backend_spec",
    "remote_spec",
]

SpecInput = str | Mapping[str, object] | VLLMSpec | SGLangSpec | LlamaCppSpec | OpenAIChatSpec | EmbeddedSpec
_SPEC_MODELS = (VLLMSpec, SGLangSpec, LlamaCppSpec, OpenAIChatSpec, EmbeddedSpec)


class BackendSpecError(ValueError):
    """A spec that describes no backend: ``field`` is the one at fault (``kind``, ``url``,
    ``spec`` for the whole string); the message starts with it."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    @classmethod
    def of(cls, error: ValidationError) -> BackendSpecError:
        """The first problem pydantic found (all of them in the message)."""
        found = [(".".join(str(p) for p in e["loc"]) or "spec", e["msg"]) for e in error.errors()]
        first = cls(found[0][0], found[0][1])
        if len(found) > 1:
            first.args = ("; ".join(f"{field}: {message}" for field, message in found),)
        return first


def parse_backend_spec(spec: SpecInput) -> AnySpec:
    """The spec model for a command-line string, a dict, or a spec; ``BackendSpecError``
    naming the field if it describes no backend."""
    if isinstance(spec, _SPEC_MODELS):
        return spec
    data = _from_string(spec) if isinstance(spec, str) else spec
    try:
        return BackendSpec.model_validate(data).spec()
    except ValidationError as exc:
        raise BackendSpecError.of(exc) from None


def remote_spec(spec: SpecInput) -> ServerSpec:
    """``spec`` if it names an inference server by URL; ``BackendSpecError`` for an
    embedded one."""
    parsed = parse_backend_spec(spec)
    if isinstance(parsed, EmbeddedSpec):
        raise BackendSpecError("kind", EMBEDDED_OVER_HTTP)
    return parsed


def _from_string(text: str) -> object:
    text = text.strip()
    if not text:
        raise BackendSpecError("spec", "expected 'embedded', a URL, 'KIND=VALUE' or a JSON object")
    if text == "embedded":
        return {"kind": "embedded"}
    if text.startswith(("http://", "https://")):
        return {"kind": "vllm", "url": text}
    if text.startswith("{"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise BackendSpecError("spec", f"not valid JSON: {exc.msg} (column {exc.colno})") from None
    kind, sep, value = text.partition("=")
    if not sep:
        raise BackendSpecError("spec", f"{text!r} is not 'embedded', a URL, 'KIND=VALUE' or a JSON object")
    if kind in SERVER_KINDS:
        return {"kind": kind, "url": value}
    if kind == "embedded":
        return {"kind": "embedded", "model_path": value or None}
    raise BackendSpecError("kind", f"unknown backend kind {kind!r}; expected one of {', '.join(KINDS)}")


def backend_from_spec(spec: SpecInput) -> LLMBackend:
    """Build the backend a spec describes (nothing is contacted yet)."""
    parsed = parse_backend_spec(spec)
    if isinstance(parsed, EmbeddedSpec):
        from rollserve.llm.backends.embedded import EmbeddedBackend  # (numpy: only when asked)

        backend = EmbeddedBackend(model_path=parsed.model_path, n_ctx=parsed.n_ctx, name=parsed.name or "embedded")
        backend.weight = parsed.weight
        return backend
    try:
        if isinstance(parsed, VLLMSpec):
            return VLLMBackend(
                parsed.url,
                name=parsed.name,
                model=parsed.model,
                api_key=parsed.api_key,
                timeout=parsed.timeout,
                weight=parsed.weight,
                max_connections=parsed.max_connections,
                endpoint=parsed.endpoint,
                prefix_cache=parsed.prefix_cache,
            )
        server: type[ServerBackend] = (
            SGLangBackend
            if isinstance(parsed, SGLangSpec)
            else LlamaCppServerBackend
            if isinstance(parsed, LlamaCppSpec)
            else OpenAIChatBackend
        )
        return server(
            parsed.url,
            name=parsed.name,
            model=parsed.model,
            api_key=parsed.api_key,
            timeout=parsed.timeout,
            weight=parsed.weight,
            max_connections=parsed.max_connections,
        )
    except ValueError as exc:  # the URL, as the HTTP client checks it
        raise BackendSpecError("url", str(exc).removeprefix("url: ")) from exc
