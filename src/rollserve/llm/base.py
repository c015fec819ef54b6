"""The llm layer's contracts: what every caller of ``rollserve.llm`` may rely on.

- ``LLMBackend``: an inference server or in-process model. A token-level backend
  (``trainable = True``) samples from token ids (``generate``); a message-level one
  (an API model, ``trainable = False``) answers a conversation (``chat``) and the
  agent loop keeps a chat-only trajectory for it. Its routing ``weight`` and its
  ``context_window()`` (None where unknown) are part of the contract. ``Pausable`` is
  an optional capability a backend declares by inheriting it (vLLM dev mode,
  SGLang): the router forwards ``pause``/``resume`` to exactly those around a
  weight update. ``LoadsWeights`` is another (vLLM, SGLang): the server takes new
  weights at run time (a LoRA adapter, or full weights from disk), and later
  requests name what was loaded.
- ``LLMSession``: a trajectory's sticky handle on the router (``routing.session``),
  what the agent loop calls.
- ``Tokenizer``: the policy's tokenizer and chat template, local
  (``tokens.tokenizer.ChatTokenizer``) or the serving backend's
  (``tokens.backend_tokenizer.BackendTokenizer``). The agent layer asks it for a
  ``PromptBuilder`` (append-only prompts) and whether its template renders tools.
- ``SlotWait`` (in ``SLOT_WAIT``, set by the router around one try): a backend
  reports there how long the try queued for a connection slot in its bounded pool,
  which the try's ``attempt_timeout`` does not count.

The packages underneath import this module and never one another's internals:
``backends`` (servers and in-process models), ``tokens`` (tokenizers, chat
templates, prompts; it may use ``backends.http``) and ``routing`` (router,
sessions, health, policies, deadlines). ``tests/llm/test_layering.py`` holds them to it.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol, Required, TypedDict

# The wire model (rollserve.contract); the llm layer samples with it.
from rollserve.contract import SamplingParams
from rollserve.errors import InfraError, LLMError

__all__ = [
    "BackendKind",
    "ChatReply",
    "Fidelity",
    "Generation",
    "LLMBackend",
    "LLMSession",
    "LoadsWeights",
    "Message",
    "PauseMode",
    "Pausable",
    "PromptBuilder",
    "SamplingParams",
    "SlotWait",
    "Tokenizer",
    "TokenizerError",
    "ToolSchema",
    "WeightsKind",
]


class Message(TypedDict, total=False):
    """A chat message as chat templates and chat APIs take it (OpenAI's format): the
    agent loop, the environments and the gateway build them, the tokenizers render
    them and message-level backends send them. ``content`` is text; an assistant
    message of a chat API may carry its ``tool_calls``, and a tool result the ``name``
    of its tool and the ``tool_call_id`` of the call it answers."""

    role: Required[str]  # system | user | assistant | tool
    content: Required[str]
    name: str
    tool_calls: list[dict[str, Any]]  # OpenAI's shape, as the chat API returned them
    tool_call_id: str


ToolSchema = dict[str, Any]  # a tool as chat templates and APIs take it ({"type": "function", ...})
PauseMode = Literal["finish", "abort"]
BackendKind = Literal["tokens", "messages"]  # what a backend takes: token ids, or messages
WeightsKind = Literal["lora", "full"]  # a LoRA adapter, or every weight of the model


# --- what a backend answers ----------------------------------------------------------------
@dataclass
class Generation:
    """What a backend sampled for one prompt, verbatim."""

    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length" | "abort"
    backend: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    policy_version: int | None = None  # stamped by the router when it sent the request

    def __post_init__(self) -> None:
        if len(self.output_ids) != len(self.logprobs):
            raise ValueError(f"backend returned {len(self.output_ids)} ids but {len(self.logprobs)} logprobs")


@dataclass
class ChatReply:
    """What a message-level backend answered: text (and tool calls), no token ids."""

    content: str
    finish_reason: str  # "stop" | "length" | "tool_calls" | ...
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # OpenAI's shape
    backend: str = ""
    usage: dict[str, Any] = field(default_factory=dict)  # prompt_tokens, completion_tokens...
    policy_version: int | None = None


# --- backends -------------------------------------------------------------------------------
class SlotWait:
    """One try's wait for a connection slot in its backend's bounded pool: the queue is
    ours, not the server's, so the router's clock for the try (``attempt_timeout``)
    does not count it. The router sets one in ``SLOT_WAIT`` around a try; a backend
    calls ``begin``/``end`` around its wait (a backend that never does is timed from
    the start of the try)."""

    def __init__(self) -> None:
        self.since: float | None = None  # loop time the wait now going on began
        self.waited = 0.0  # seconds of waits that ended
        self.ended = asyncio.Event()

    def begin(self) -> None:
        self.since = asyncio.get_running_loop().time()
        self.ended.clear()

    def end(self) -> None:
        if self.since is not None:
            self.waited += asyncio.get_running_loop().time() - self.since
            self.since = None
        self.ended.set()

    def total(self, now: float) -> float:
        """Seconds waited so far, the wait now going on included."""
        return self.waited + (now - self.since if self.since is not None else 0.0)


SLOT_WAIT: ContextVar[SlotWait | None] = ContextVar("rollserve_slot_wait", default=None)


class LLMBackend(ABC):
    """An inference server (or in-process model) the router sends calls to.

    Token-level (``trainable = True``): ``generate`` samples from token ids and
    returns the sampled ids and their logprobs verbatim. Message-level
    (``trainable = False``): ``chat`` answers a conversation, and ``generate`` is a
    non-retryable ``LLMError``. Failures are ``LLMError`` (infra: the rollout is
    masked), saying whether another try may succeed; a prompt that does not fit the
    backend's context window is a ``ContextWindowError``.
    """

    kind: ClassVar[str] = "backend"
    trainable: ClassVar[bool] = True  # False: message level, no token ids to train on
    name: str  # unique among the router's backends
    weight: float = 1.0  # routing weight (relative capacity), set per backend

    @abstractmethod
    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        """Sample a continuation of ``prompt_ids``."""

    async def chat(
        self, messages: list[Message], sampling: SamplingParams, tools: list[ToolSchema] | None = None
    ) -> ChatReply:
        """Answer ``messages`` (message-level backends only; others refuse)."""
        raise LLMError(
            f"{self.name}: a token-level backend samples from token ids; it has no message-level chat",
            backend=self.name,
            retryable=False,
        )

    def context_window(self) -> int | None:
        """The most tokens a prompt and its sample may hold here; None where unknown
        (a server's is read at its health checks)."""
        return None

    @abstractmethod
    async def health(self) -> bool:
        """True if the backend can take requests now (the router's health probe)."""

    @abstractmethod
    async def close(self) -> None:
        """Release connections (or the model); the backend takes no more calls."""

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """What the backend is, for listings (``GET /v1/llm/backends``): JSON values."""


class Pausable(ABC):
    """A backend whose server can stop generating around a weight update (vLLM dev
    mode, SGLang); the router forwards its own pause and resume to these."""

    @abstractmethod
    async def pause(self, mode: PauseMode = "finish") -> None:
        """``finish``: let requests in flight end first; ``abort``: abort them."""

    @abstractmethod
    async def resume(self) -> None:
        """Generate again."""


class LoadsWeights(ABC):
    """A backend whose server takes new weights at run time (vLLM, SGLang). The router
    calls these only while generation is paused with nothing in flight; a failure is an
    ``LLMError`` saying what the server answered. After a load, every request the
    backend sends samples from the new weights (after a LoRA load: names the adapter)."""

    weight_kinds: ClassVar[frozenset[WeightsKind]]  # what this kind of server can load

    @abstractmethod
    async def load_lora(self, name: str, path: str) -> None:
        """Load (or reload in place) the LoRA adapter at ``path`` (a folder the server
        can read) under ``name``; later requests name it."""

    @abstractmethod
    async def load_full(self, path: str, policy_version: int | None = None) -> None:
        """Reload every weight of the served model from ``path`` (a folder the server
        can read); later requests name the base model."""

    @abstractmethod
    def loaded_model(self) -> str | None:
        """The model name later requests carry (the adapter after a LoRA load)."""

    @abstractmethod
    def adopt(self, lora: str | None) -> None:
        """Name the LoRA adapter ``lora`` in later requests (None: the base model), as
        a load by another router (a cluster's head), or by this one before the backend
        was added, left this backend's server; nothing is sent to the server."""


# --- a trajectory's session ------------------------------------------------------------------
class LLMSession(Protocol):
    """A sticky handle on the inference layer for one trajectory (``routing.session``)."""

    @property
    def policy_version(self) -> int | None:
        """The policy version in force now (each reply carries its own stamp too)."""
        ...

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        """Sample on a token-level backend."""
        ...

    async def chat(
        self, messages: list[Message], sampling: SamplingParams, tools: list[ToolSchema] | None = None
    ) -> ChatReply:
        """Answer on a message-level backend."""
        ...

    async def message_level(self) -> bool:
        """True if this trajectory runs on a message-level (not trainable) backend."""
        ...

    def context_window(self) -> int | None:
        """The context window bounding this trajectory's prompts, if any backend it may
        run on reports one (``LLMBackend.context_window``)."""
        ...

    def close(self) -> None:
        """The trajectory is over (it no longer counts as pinned to its backend)."""
        ...


# --- tokenizers and prompts ------------------------------------------------------------------
class TokenizerError(InfraError):
    """The tokenizer could not be found, loaded or probed; the message says what to do."""


@dataclass
class Fidelity:
    """How faithfully a trajectory's token sequence matches its conversation."""

    append_only: bool = True
    template_checked: bool = False
    mismatches: int = 0
    first_mismatch: int | None = None
    fallback_deltas: int = 0  # deltas built from a probe conversation, not the real one

    def to_dict(self) -> dict[str, bool | int | None]:
        return {
            "append_only": self.append_only,
            "template_checked": self.template_checked,
            "mismatches": self.mismatches,
            "first_mismatch": self.first_mismatch,
            "fallback_deltas": self.fallback_deltas,
        }


class PromptOverBudget(Exception):
    """A prompt proven to take more than the builder's ``max_prompt_tokens``, found
    before it was tokenized: ``at_least`` tokens (``tokens.bytes_bound``: the text's
    UTF-8 bytes over the most bytes one token can stand for)."""

    def __init__(self, at_least: int, text_bytes: int, token_bytes: int) -> None:
        super().__init__(
            f"at least {at_least} tokens ({text_bytes} bytes of text, at most {token_bytes} bytes a token)"
        )
        self.at_least = at_least
        self.text_bytes = text_bytes
        self.token_bytes = token_bytes


class PromptBuilder(Protocol):
    """The token prompts of one trajectory, append-only (``tokens.chat``).

    ``max_prompt_tokens`` (None: no bound): a builder that can prove a prompt longer
    before tokenizing it raises ``PromptOverBudget`` instead (a local one measures the
    rendered text; a backend's cannot, and tokenizes)."""

    fidelity: Fidelity
    max_prompt_tokens: int | None

    async def afirst(self, messages: list[Message]) -> list[int]:
        """Ids of the opening prompt (the messages and the generation prompt)."""
        ...

    async def aassistant_content(self, output_ids: list[int], finish_reason: str) -> str:
        """The assistant message's text for sampled ids (without the closing stop token)."""
        ...

    async def adelta(self, history: list[Message], new: list[Message], sequence: list[int]) -> list[int]:
        """Ids to append after ``sequence`` (prompt + sampled ids so far) for ``new``."""
        ...

    async def acheck(self, messages: list[Message], sequence: list[int]) -> Fidelity:
        """Compare ``sequence`` with a full render of ``messages`` (sets ``fidelity``)."""
        ...


class Tokenizer(Protocol):
    """The policy's tokenizer and chat template, as the agent layer and the server use it.

    ``ready()`` is awaited before ``eos_token_id`` and ``renders_tools`` are read: a
    local tokenizer knows them at once, a serving backend's is probed over HTTP the
    first time (a failure is a ``TokenizerError`` or ``LLMError``: infra), and reading
    either before it is a ``TokenizerError``.
    """

    @property
    def name(self) -> str: ...

    @property
    def eos_token_id(self) -> int:
        """The token the template ends an assistant turn with."""
        ...

    @property
    def renders_tools(self) -> bool:
        """Whether the chat template renders a ``tools`` argument (else the tools are
        described in the system prompt)."""
        ...

    @property
    def max_token_bytes(self) -> int | None:
        """The most UTF-8 bytes of text one token can stand for (``tokens.bytes_bound``);
        None when unknown. A text of B bytes takes at least ceil(B / it) tokens."""
        ...

    async def ready(self) -> None:
        """Learn what the facts above need (once); returns at once afterwards."""
        ...

    def prompt_builder(self, tools: list[ToolSchema] | None = None) -> PromptBuilder:
        """A builder for one trajectory's prompts, with ``tools`` passed to the template."""
        ...

    async def close(self) -> None:
        """Release what the tokenizer holds (a backend tokenizer's HTTP session)."""
        ...
