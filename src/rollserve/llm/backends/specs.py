"""Backend specs: one pydantic model per kind, told apart by ``kind`` (a tagged union).

    {"kind": "vllm", "url": "http://host:8000", "name": "gpu0", "model": "policy",
     "endpoint": "auto", "weight": 2}
    {"kind": "sglang" | "llamacpp" | "openai_chat", "url": ..., "name"?, "model"?, ...}
    {"kind": "embedded", "model_path"?: "/path/model.gguf", "n_ctx"?: 4096}

``kind`` may be left out for vLLM (``{"url": ...}``). ``BackendSpec`` is every kind,
for the command line; ``RemoteBackendSpec`` the servers only, for the API
(``POST /v1/llm/backends``) and ProRL's ``/add_llm_server``: an embedded backend loads
a model file from the server's own disk into its process, so only the command line
may start one. A spec that does not fit is a ``ValidationError`` naming the field as
written (``url``, ``kind``...), never the union's inner names.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    RootModel,
    Tag,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)
from pydantic_core import ErrorDetails, InitErrorDetails, PydanticCustomError
from pydantic_core.core_schema import NoInfoWrapValidatorFunction as WrapValidatorFunction

EMBEDDED_OVER_HTTP = (
    "an embedded backend loads a model file from the server's disk into its "
    "process, so only the command line starts one (rollserve serve --backend "
    "embedded[=PATH]); over HTTP, register an inference server by its URL"
)


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        pattern=r"^[A-Za-z0-9._:@+=-]+$",
        description="unique name; derived from the URL (or 'embedded') if unset",
    )
    weight: float = Field(1.0, gt=0, le=1000, description="routing weight (relative capacity)")


class _ServerSpec(_Spec):
    url: str = Field(
        ...,
        min_length=8,
        max_length=2048,
        pattern=r"^https?://[!-~]+$",
        description="base URL of the server (http:// or https://, ASCII)",
    )
    model: str | None = Field(None, max_length=1000, description="served model name; the server's first if unset")
    api_key: str | None = Field(
        None, max_length=10_000, pattern=r"^[!-~]+$", description="sent as a bearer token (printable ASCII)"
    )
    timeout: float = Field(600.0, gt=0, le=86_400, description="seconds per request")
    max_connections: int = Field(
        1024,
        ge=1,
        le=65_536,
        description="sampling requests sent to this server at once; more wait in order for one "
        "to finish (the wait is not counted in the request's timeout; the rollout's deadline bounds it)",
    )


class VLLMSpec(_ServerSpec):
    """A vLLM server (the kind when ``kind`` is left out)."""

    kind: Literal["vllm"] = Field("vllm", description="vllm (the default when left out)")
    endpoint: Literal["completions", "generate", "auto"] = Field(
        "completions", description="/v1/completions, /inference/v1/generate, or try both"
    )
    prefix_cache: Literal["reset", "off"] = Field(
        "reset",
        description="reset: after each weight load, reset the server's prefix cache "
        "(POST /reset_prefix_cache: VLLM_SERVER_DEV_MODE=1), else the load fails; off: the "
        "server was started with --no-enable-prefix-caching, so there is nothing to reset",
    )


class SGLangSpec(_ServerSpec):
    """An SGLang server (``/generate``)."""

    kind: Literal["sglang"] = Field(description="sglang")


class LlamaCppSpec(_ServerSpec):
    """A llama.cpp server (``/completion``)."""

    kind: Literal["llamacpp"] = Field(description="llamacpp")


class OpenAIChatSpec(_ServerSpec):
    """An OpenAI-compatible chat API: message level, not trainable."""

    kind: Literal["openai_chat"] = Field(description="openai_chat")


class EmbeddedSpec(_Spec):
    """The in-process model (command line only)."""

    kind: Literal["embedded"] = Field(description="embedded (command line only)")
    model_path: str | None = Field(None, description="a GGUF file; SmolLM2 if unset")
    n_ctx: int = Field(4096, ge=128, le=1_000_000, description="context length")


ServerSpec = VLLMSpec | SGLangSpec | LlamaCppSpec | OpenAIChatSpec
AnySpec = VLLMSpec | SGLangSpec | LlamaCppSpec | OpenAIChatSpec | EmbeddedSpec
SERVER_SPECS: dict[str, type[_ServerSpec]] = {
    "vllm": VLLMSpec,
    "sglang": SGLangSpec,
    "llamacpp": LlamaCppSpec,
    "openai_chat": OpenAIChatSpec,
}
SPECS: dict[str, type[_Spec]] = {**SERVER_SPECS, "embedded": EmbeddedSpec}
SERVER_KINDS = tuple(SERVER_SPECS)
KINDS = tuple(SPECS)


_KIND_OF: dict[type[_Spec], str] = {model: kind for kind, model in SPECS.items()}
_NO_KIND = object()


def _raw_kind(value: object) -> object:
    """What ``value`` says its kind is (``vllm`` when left out), whatever its type."""
    if isinstance(value, _Spec):
        return _KIND_OF[type(value)]
    if isinstance(value, dict):
        return value.get("kind", "vllm")
    return _NO_KIND


def _tag(value: object) -> str | None:
    """The union's discriminator: the kind, when it is a string."""
    kind = _raw_kind(value)
    return kind if isinstance(kind, str) else None


def _as_written(kinds: tuple[str, ...], refused: dict[str, str]) -> WrapValidatorFunction:
    """Validate with the tagged union, then name the fields as written: pydantic puts the
    tag in front (``sglang.url``) and says nothing of ``kind`` when it names no model."""

    def validate(value: object, handler: ValidatorFunctionWrapHandler) -> object:
        try:
            return handler(value)
        except ValidationError as exc:
            found = [_written(error, value, kinds, refused) for error in exc.errors()]
            raise ValidationError.from_exception_data(exc.title, found) from None

    return validate


def _written(error: ErrorDetails, value: object, kinds: tuple[str, ...], refused: dict[str, str]) -> InitErrorDetails:
    if error["type"] in ("union_tag_invalid", "union_tag_not_found"):
        kind = _raw_kind(value)
        if kind is _NO_KIND:
            return _detail((), value, "expected an object: the backend's kind and settings")
        message = refused.get(kind) if isinstance(kind, str) else None
        return _detail(("kind",), kind, message or f"unknown backend kind {kind!r}; expected one of {', '.join(kinds)}")
    loc = error["loc"]
    detail: InitErrorDetails = {
        "type": error["type"],
        "input": error["input"],
        "loc": loc[1:] if loc and loc[0] in kinds else loc,
    }
    if "ctx" in error:
        detail["ctx"] = error["ctx"]
    return detail


def _detail(loc: tuple[str, ...], value: object, message: str) -> InitErrorDetails:
    error = PydanticCustomError("backend_spec", "{message}", {"message": message})
    return {"type": error, "loc": loc, "input": value}


_ServerUnion = Annotated[
    Annotated[VLLMSpec, Tag("vllm")]
    | Annotated[SGLangSpec, Tag("sglang")]
    | Annotated[LlamaCppSpec, Tag("llamacpp")]
    | Annotated[OpenAIChatSpec, Tag("openai_chat")],
    Discriminator(_tag),
]
_AnyUnion = Annotated[
    Annotated[VLLMSpec, Tag("vllm")]
    | Annotated[SGLangSpec, Tag("sglang")]
    | Annotated[LlamaCppSpec, Tag("llamacpp")]
    | Annotated[OpenAIChatSpec, Tag("openai_chat")]
    | Annotated[EmbeddedSpec, Tag("embedded")],
    Discriminator(_tag),
]


class BackendSpec(
    RootModel[
        Annotated[
            _AnyUnion,
            WrapValidator(
                _as_written(KINDS, {}), json_schema_input_type=Annotated[AnySpec, Field(discriminator="kind")]
            ),
        ]
    ]
):
    """An inference backend of any kind (the command line): its model by ``kind``."""

    def spec(self) -> AnySpec:
        """The backend's own spec model (``VLLMSpec``, ``EmbeddedSpec``...)."""
        return self.root


class RemoteBackendSpec(
    RootModel[
        Annotated[
            _ServerUnion,
            WrapValidator(
                _as_written(SERVER_KINDS, {"embedded": EMBEDDED_OVER_HTTP}),
                json_schema_input_type=Annotated[ServerSpec, Field(discriminator="kind")],
            ),
        ]
    ]
):
    """An inference server registered over HTTP, by URL (never an embedded model)."""

    def spec(self) -> ServerSpec:
        """The server's own spec model (``VLLMSpec``, ``SGLangSpec``...)."""
        return self.root
