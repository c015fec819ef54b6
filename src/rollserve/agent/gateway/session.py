"""One rollout's gateway session: a harness's chat calls as exact token-level turns.

Each call renders the harness's messages with the policy's chat template and builds
the prompt append-only, as the agent loop does:

1. the messages are the conversation so far (the last call's messages and the reply
   it got, compared as ``messages.normalized``) plus new ones: the prompt is the
   sequence so far (prompt and sampled ids, never re-tokenized) and the template's
   delta for the new messages (``PromptBuilder.adelta``);
2. else the full render, when its token ids start with the sequence so far: the
   rest of it is appended;
3. else the harness rewrote its history (truncated, summarised, edited an earlier
   message, changed its tools): the full render starts a new sequence
   (``Trajectory.start_sequence``).

Tokens the harness sent are always prompt tokens (loss_mask 0): only ids the backend
sampled for a call are ever marked 1, so an assistant turn a harness wrote or edited
is never trained on as the policy's.

The call goes through the rollout's ``LLMSession`` (the router: pause, policy
versions, sticky backend, deadlines) with the trainer's sampling parameters; the
harness may only lower ``max_tokens``. What a call is refused is a
typed ``GatewayRefusal`` (``agent.gateway.base``; for the harness, an error in its
wire's shape: OpenAI's or Anthropic's); a backend failure also fails the rollout (``failure``: infra, masked).
The session ends when the harness says so, at ``max_turns``, or at the deadline
(``agent.clock``: ``time_limit`` when the harness took the time, a masked
``DeadlineFailure`` when the backend did).

Auxiliary calls (``GatewayLimits.calls``: a call asking for another model than the
main loop's, ``contract.calls.GatewayCalls``) are answered the same way but rendered
whole and recorded apart (``Trajectory.auxiliary``, each its own sequence, with its
purpose and the model asked): they never extend, break or end the main loop's
sequences, never count toward ``max_turns`` (at most ``max_turns`` of them are
answered), and never become the reply the episode is graded on (``last_text``).
``count_tokens`` renders a request whole and counts its ids, sampling nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass

from rollserve.agent.base import EndedBy
from rollserve.agent.clock import EpisodeClock, LoopStats, TimeUp
from rollserve.agent.gateway.base import (
    BackendFailed,
    BadRequest,
    ContextLengthExceeded,
    SessionEnded,
    TimeLimit,
    TooManyCalls,
)
from rollserve.agent.gateway.bounds import (
    COUNTS_PER_TURN,
    MAX_WAITING_CALLS,
    max_body_bytes,
    sized,
)
from rollserve.agent.gateway.messages import (
    Normal,
    Reply,
    Unsupported,
    normalized,
    parse_reply,
    presentation,
    reply_message,
    template_tools,
)
from rollserve.agent.gateway.prompts import (
    TEMPLATE_ERRORS,
    FinishReason,
    convert,
    finish_reason,
    record_call,
    standalone_turn,
    too_long,
    unrenderable,
    whole,
)
from rollserve.agent.tool_calls import ToolPresentation
from rollserve.agent.trajectory import AuxiliaryTurn, Trajectory
from rollserve.contract import SamplingParams
from rollserve.contract.calls import GatewayCalls
from rollserve.contract.gateway import ChatCompletionRequest
from rollserve.errors import InfraError, PromptTooLongError, RolloutError, context_window_error
from rollserve.llm.base import (
    Generation,
    LLMSession,
    Message,
    PromptBuilder,
    PromptOverBudget,
    Tokenizer,
)

__all__ = ["MAX_WAITING_CALLS", "FinishReason", "GatewayLimits", "GatewayReply", "GatewaySession", "NoCallError"]


class NoCallError(InfraError):
    """The session ended before the harness made a model call: nothing was sampled."""


@dataclass(frozen=True)
class GatewayLimits:
    """What bounds a session: the trainer's sampling and limits, and its deadline."""

    sampling: SamplingParams
    max_turns: int
    max_context_tokens: int
    deadline: float | None  # event-loop time at which the episode ends itself
    parse_tool_calls: bool = True  # Hermes blocks become tool_calls (with tools offered)
    calls: GatewayCalls = GatewayCalls()  # which calls are the main loop's, which auxiliary


@dataclass(frozen=True)
class GatewayReply:
    """What one call answers, for the harness."""

    reply: Reply
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int


@dataclass
class _Conversation:
    """The current sequence's conversation: as the harness spells it, as the template
    took it, with which tools, and the builder that made its prompts."""

    normal: list[Normal]
    template: list[Message]
    tools_key: str
    builder: PromptBuilder


class GatewaySession:
    """See the module's docstring."""

    def __init__(
        self, rollout_id: str, llm: LLMSession, tokenizer: Tokenizer, trajectory: Trajectory, limits: GatewayLimits
    ) -> None:
        self.rollout_id = rollout_id
        self.llm = llm
        self.tokenizer = tokenizer
        self.trajectory = trajectory
        self.limits = limits
        self.stats = LoopStats()
        self.clock = EpisodeClock(limits.deadline, self.stats)
        self.calls = 0  # calls answered with a sample
        self.context_refusals = 0
        self.token_counts = 0  # count_tokens calls answered (COUNTS_PER_TURN per turn at most)
        self.last_text: str | None = None  # the last reply's text (sampled ids, decoded)
        self.ended_by: EndedBy | None = None
        self.failure: RolloutError | None = None
        self._ended = asyncio.Event()
        self._lock = asyncio.Lock()
        self._conversation: _Conversation | None = None
        self._refused_last = False
        self._waiting = 0  # calls in ``complete``, waiting or running

    @property
    def ended(self) -> bool:
        return self._ended.is_set()

    # --- the harness's side --------------------------------------------------------------
    @contextlib.contextmanager
    def admitted(self) -> Iterator[None]:
        """One call's admission, taken BEFORE its body is read and held until it is
        answered: past ``MAX_WAITING_CALLS`` calls at once, ``TooManyCalls`` (so a
        session holds at most that many bodies); a session that has ended,
        ``SessionEnded``."""
        self._refuse_if_ended()
        if self._waiting >= MAX_WAITING_CALLS:
            raise TooManyCalls(
                f"{self._waiting} calls of this session are already in progress; send one call at a time"
            )
        self._waiting += 1
        try:
            yield
        finally:
            self._waiting -= 1

    @property
    def max_body_bytes(self) -> int:
        """The largest request body this session reads (``bounds.max_body_bytes``)."""
        return max_body_bytes(self._context_limit(), self.tokenizer.max_token_bytes)

    async def complete(
        self, request: ChatCompletionRequest, call_ids: str = "call_", size: int | None = None
    ) -> GatewayReply:
        """Answer one admitted call (``admitted``; one at a time: concurrent calls of a
        session wait their turn); every wait of the call is bounded by the deadline
        (then ``TimeLimit``). The reply's tool calls get ids starting ``call_ids`` (OpenAI's
        ``call_``, Anthropic's ``toolu_``). ``size``: the bytes of the body ``request``
        was parsed from (None: unknown), for where it is converted (``bounds.sized``)."""
        self._refuse_if_ended()
        try:  # everything a call waits on (its turn, a usable backend, the sample)
            async with asyncio.timeout_at(self.limits.deadline) as limit, self._lock:
                self._refuse_if_ended()
                return await self._complete(request, call_ids, size)
        except TimeoutError:
            if limit.expired():
                raise self._time_up() from None
            raise

    def finish(self, reason: EndedBy = "finished") -> None:
        """The harness is done (or a limit ended the episode): no more calls."""
        if not self.ended:
            self.ended_by = reason
            self._ended.set()

    # --- the rollout's side ----------------------------------------------------------------
    async def wait(self) -> None:
        """Until the session ends (bounded by the deadline); raises its failure."""
        try:
            async with asyncio.timeout_at(self.limits.deadline):
                await self._ended.wait()
        except TimeoutError:
            self._expire()
        if self.ended_by is None and self.failure is None:
            self.ended_by = "finished"
        if self._refused_last and self.ended_by == "finished":
            self.ended_by = "context_exhausted"  # the harness gave up on a full context
        if self.failure is None and not self.trajectory.turns:
            # Nothing the policy sampled to score (a harness that never called, or one
            # that failed to start): masked, never a reward of 0 for the policy.
            self.failure = (
                PromptTooLongError(
                    "every prompt the harness sent was refused for the context limit: nothing was sampled to score"
                )
                if self.context_refusals
                else NoCallError(
                    f"the session ended ({self.ended_by}) before the harness made a "
                    "model call of its main loop: nothing was sampled to score" + self._auxiliary_only()
                )
            )
        # The harness's time: everything the backend did not take.
        self.stats.env_seconds = max(0.0, time.perf_counter() - self.clock.started - self.stats.llm_seconds)
        if self.failure is not None:
            raise self.failure

    # --- internals -----------------------------------------------------------------------
    def _auxiliary_only(self) -> str:
        count = len(self.trajectory.auxiliary)
        if not count:
            return ""
        asked = sorted({a.model for a in self.trajectory.auxiliary})
        return (
            f" ({count} auxiliary calls asked for {', '.join(map(repr, asked))}, none for "
            f"the main model {self.limits.calls.main_model!r})"
        )

    def _refuse_if_ended(self) -> None:
        if self.ended:
            raise SessionEnded(
                f"the session of rollout {self.rollout_id} has ended "
                f"({self.ended_by or 'failed'}); it takes no more calls"
            )

    def _expire(self) -> None:
        """The deadline came: the episode ends, charged as ``agent.clock`` decides."""
        if self.ended:
            return
        self.stats.env_seconds = max(0.0, time.perf_counter() - self.clock.started - self.stats.llm_seconds)
        try:
            self.finish(self.clock.end(self.trajectory))
        except RolloutError as exc:
            self.failure = exc
            self._ended.set()

    def _time_up(self) -> TimeLimit:
        self._expire()
        return TimeLimit("the rollout's time limit passed")

    def _fail(self, error: RolloutError) -> BackendFailed:
        self.failure = error
        self._ended.set()
        return BackendFailed(f"the inference backend failed: {error.message}")

    def _context_refusal(self, message: str) -> ContextLengthExceeded:
        self.context_refusals += 1
        self._refused_last = True
        return ContextLengthExceeded(message)

    async def count_tokens(self, request: ChatCompletionRequest, size: int | None = None) -> int:
        """How many tokens ``request``'s whole render takes with the policy's template
        and tokenizer (its tools included): nothing is sampled or recorded. Refused as a
        call is (ended, deadline, bad messages, past the context limit from its bytes)."""
        self._refuse_if_ended()
        # Bounded like the calls themselves: each count renders and tokenizes a whole
        # request on the server, so an agent's commands must not loop on it.
        most = COUNTS_PER_TURN * self.limits.max_turns
        if self.token_counts >= most:
            raise BadRequest(
                f"this session has counted tokens {self.token_counts} times, "
                f"{COUNTS_PER_TURN} per turn of its max_turns: no more",
                param=None,
            )
        self.token_counts += 1
        try:
            async with asyncio.timeout_at(self.limits.deadline) as limit:
                shown, template, _normal, _key = await self._converted(request, size)
                return len((await self._whole(template, shown))[1])
        except TimeoutError:
            if limit.expired():
                raise self._time_up() from None
            raise

    async def _converted(
        self, request: ChatCompletionRequest, size: int | None
    ) -> tuple[ToolPresentation | None, list[Message], list[Normal], str]:
        """The tools as the template shows them, the messages for the template, as
        compared, and the tools' key."""
        try:
            if await self.llm.message_level():
                raise InfraError(
                    "the gateway samples token ids; the rollout's backend is "
                    "message-level (an API model), which has none to record"
                )
            await self.tokenizer.ready()
            shown = presentation(request.tools, self.tokenizer)
        except RolloutError as exc:
            raise self._fail(exc) from exc
        try:  # a large conversation in a thread: it must not stall the event loop
            template, normal, tools_key = await sized(size, convert, request, shown)
        except Unsupported as exc:
            raise BadRequest(exc.message, param=exc.param) from None
        return shown, template, normal, tools_key

    async def _whole(self, template: list[Message], shown: ToolPresentation | None) -> tuple[PromptBuilder, list[int]]:
        """A fresh builder and its full render of ``template`` (``prompts.whole``)."""
        try:
            return await whole(self.tokenizer, template, shown, self._context_limit())
        except RolloutError as exc:
            raise self._fail(exc) from exc

    async def _auxiliary(
        self,
        request: ChatCompletionRequest,
        purpose: str,
        call_ids: str,
        shown: ToolPresentation | None,
        template: list[Message],
    ) -> GatewayReply:
        """An auxiliary call: rendered whole, sampled, recorded in ``Trajectory.auxiliary``."""
        if len(self.trajectory.auxiliary) >= self.limits.max_turns:
            raise BadRequest(
                f"model: this session has answered {len(self.trajectory.auxiliary)} "
                f"auxiliary calls (model {request.model!r} is not the main loop's "
                f"{self.limits.calls.main_model!r}), its max_turns: no more",
                param="model",
            )
        builder, prompt = await self._whole(template, shown)
        gen = await self._generate(prompt, request, self._context_limit(), main=False)
        text = await builder.aassistant_content(gen.output_ids, gen.finish_reason)
        reply = parse_reply(text, self.limits.parse_tool_calls and bool(request.tools), call_ids)
        self._refuse_if_ended()
        version = gen.policy_version if gen.policy_version is not None else self.llm.policy_version
        self.trajectory.auxiliary.append(
            AuxiliaryTurn(purpose, request.model, standalone_turn(prompt, gen, version, reply))
        )
        return GatewayReply(reply, finish_reason(reply, gen), len(prompt), len(gen.output_ids))

    async def _complete(self, request: ChatCompletionRequest, call_ids: str, size: int | None) -> GatewayReply:
        shown, template, normal, tools_key = await self._converted(request, size)
        purpose = self.limits.calls.purpose_of(request.model)
        if purpose is not None:
            return await self._auxiliary(request, purpose, call_ids, shown, template)
        limit = self._context_limit()
        try:
            prompt, added, extends, conversation = await self._prompt(
                normal, template, tools_key, template_tools(shown), limit
            )
        except PromptOverBudget as over:  # proven from its bytes, never tokenized
            raise self._context_refusal(too_long(limit, str(over))) from None
        except RolloutError as exc:
            raise self._fail(exc) from exc
        except TEMPLATE_ERRORS as exc:
            raise unrenderable(exc) from None
        if len(prompt) >= limit:
            raise self._context_refusal(too_long(limit, f"{len(prompt)} tokens"))
        gen = await self._generate(prompt, request, limit)
        text = await conversation.builder.aassistant_content(gen.output_ids, gen.finish_reason)
        reply = parse_reply(text, self.limits.parse_tool_calls and bool(request.tools), call_ids)
        self._refuse_if_ended()  # the deadline came meanwhile: nothing is recorded
        self._record(gen, added, extends, conversation, text, reply, request)
        if len(self.trajectory.turns) >= self.limits.max_turns:
            self.finish("max_turns")
        return GatewayReply(reply, finish_reason(reply, gen), len(prompt), len(gen.output_ids))

    async def _prompt(
        self,
        normal: list[Normal],
        template: list[Message],
        tools_key: str,
        tools: list[dict[str, object]] | None,
        limit: int,
    ) -> tuple[list[int], list[int], bool, _Conversation]:
        """The prompt, the ids it adds, whether it extends the current sequence, and the
        conversation it makes (see the module's docstring); ``PromptOverBudget`` when
        its rendered text proves it ``limit`` tokens or more."""
        trajectory = self.trajectory
        sequence = trajectory.input_ids[: trajectory.sampled_length]
        sampled = any(t.sequence == trajectory.sequence for t in trajectory.turns)
        current = self._conversation
        if sampled and current is not None and current.tools_key == tools_key:
            known = len(current.normal)
            if len(normal) > known and normal[:known] == current.normal:
                new = template[len(template) - (len(normal) - known) :]
                current.builder.max_prompt_tokens = limit - 1
                delta = await current.builder.adelta(current.template, new, sequence)
                return (
                    sequence + delta,
                    delta,
                    True,
                    _Conversation(normal, current.template + new, tools_key, current.builder),
                )
        builder = self.tokenizer.prompt_builder(tools=tools)
        builder.fidelity = trajectory.fidelity
        builder.max_prompt_tokens = limit - 1
        rendered = await builder.afirst(template)
        conversation = _Conversation(normal, template, tools_key, builder)
        if sampled and len(rendered) > len(sequence) and rendered[: len(sequence)] == sequence:
            return rendered, rendered[len(sequence) :], True, conversation
        return rendered, rendered, False, conversation

    def _context_limit(self) -> int:
        known = self.llm.context_window()
        limit = self.limits.max_context_tokens
        return limit if known is None else min(limit, known)

    async def _generate(
        self, prompt: list[int], request: ChatCompletionRequest, limit: int, main: bool = True
    ) -> Generation:
        sampling = self.limits.sampling
        wanted = [
            n
            for n in (sampling.max_tokens, request.max_tokens, request.max_completion_tokens, limit - len(prompt))
            if n is not None
        ]
        if min(wanted) != sampling.max_tokens:
            sampling = sampling.model_copy(update={"max_tokens": min(wanted)})
        try:
            return await self.clock.llm(self.llm.generate(list(prompt), sampling))
        except TimeUp:
            raise self._time_up() from None
        except RolloutError as exc:
            if (overflow := context_window_error(exc)) is not None:
                if not main:  # an auxiliary call's refusal says nothing of the main loop
                    raise ContextLengthExceeded(overflow.message) from exc
                raise self._context_refusal(overflow.message) from exc
            raise self._fail(exc) from exc

    def _record(
        self,
        gen: Generation,
        added: list[int],
        extends: bool,
        conversation: _Conversation,
        text: str,
        reply: Reply,
        request: ChatCompletionRequest,
    ) -> None:
        """Record the call's turn (no await: nothing else runs in between)."""
        trajectory = self.trajectory
        if not extends:
            trajectory.start_sequence()
        trajectory.add_prompt(added)
        version = gen.policy_version if gen.policy_version is not None else self.llm.policy_version
        turn = trajectory.add_generation(gen, policy_version=version)
        turn.tool_calls = [record_call(c.function.name, c.function.arguments, c.id) for c in reply.tool_calls]
        echoed = reply_message(reply)
        self._conversation = _Conversation(
            conversation.normal + [normalized(echoed, len(conversation.normal))],
            conversation.template + [{"role": "assistant", "content": text}],
            conversation.tools_key,
            conversation.builder,
        )
        self._refused_last = False
        self.calls += 1
        self.last_text = text
        trajectory.messages = [
            *(m.model_dump(exclude_none=True) for m in request.messages),
            echoed.model_dump(exclude_none=True, mode="json"),
        ]
        trajectory.tools = [t.model_dump(exclude_none=True) for t in request.tools] if request.tools else None
