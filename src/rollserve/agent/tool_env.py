"""ToolEnv: the AgentEnv of a tool-using episode, generic over its tools and task.

Each assistant reply is parsed for tool calls in the configured format
(``tool_format``: Hermes ``<tool_call>`` blocks, plain JSON calls, or one fenced
```` ```bash ```` block; see ``agent.tool_calls``); the calls run in order (each
bounded by ``call_timeout``), and their results go back as ``tool`` messages. The
episode ends when a finish tool is called (with ``bash_block``: when a command's
output starts with the submit marker, which calls the finish tool, if any, with the
rest of the output), or, if so configured, when a reply calls no tool. Malformed
calls, unknown tools and tool errors are the agent's failures: the model is told,
and they are counted for the result's stats.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rollserve.agent.base import AgentEnv, FinishingTool, Message, Step, Tool, ToolCallRecord
from rollserve.agent.tool_calls import (
    MalformedCall,
    ParsedReply,
    ToolFormat,
    parse_tool_calls,
    present_tools,
    submitted_output,
    template_tools,
    tool_message,
)
from rollserve.agent.tools import ToolOutcome, call_tool
from rollserve.llm.base import Tokenizer
from rollserve.sandbox.tools import truncate_middle

NUDGE = (
    "Your reply did not call a tool. Call one of the tools with a <tool_call> block, or call finish when you are done."
)
NUDGES: dict[str, str] = {
    "hermes": NUDGE,
    "json": "Your reply did not call a tool. Call one of the tools with a JSON object "
    '{"name": ..., "arguments": {...}}, or call finish when you are done.',
    "bash_block": "Your reply had no bash code block. Reply with exactly one ```bash block, "
    "or submit when you are done.",
}


class ToolEnvConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    call_timeout: float = Field(
        660.0,
        gt=0,
        description="seconds per tool call, then an error; a safety net above "
        "each tool's own limits (bash: 600 s at most), which end calls more gracefully",
    )
    max_calls_per_turn: int = Field(8, ge=1, description="more calls in one reply are refused")
    on_no_call: Literal["nudge", "end"] = Field(
        "nudge", description="a reply without a tool call: remind the model, or end the episode"
    )
    nudge_message: str | None = Field(
        None, description="what a reply without a call is told (default: per tool_format)"
    )
    tool_format: ToolFormat = Field(
        "hermes",
        description="how the model calls tools: hermes (<tool_call> blocks), json "
        "(JSON function calls), bash_block (one ```bash block per reply: the bash tool)",
    )
    tools_in: Literal["auto", "template", "prompt"] = Field(
        "auto",
        description="present the schemas through the chat template's tools (or a "
        "chat API's), in the system prompt, or auto: the template if it renders them",
    )
    max_result_chars: int = Field(20_000, ge=200, description="longer tool results keep head+tail")


@dataclass
class ToolStats:
    calls: int = 0
    errors: int = 0  # tool calls that came back as errors (incl. timeouts)
    parse_errors: int = 0  # malformed <tool_call> blocks
    unknown_tools: int = 0
    timeouts: int = 0
    no_call_replies: int = 0
    seconds: float = 0.0
    by_tool: dict[str, int] = field(default_factory=dict)

    def as_stats(self) -> dict[str, int]:
        """Counts for ``rollout.stats`` (the time goes to ``timing.tools``)."""
        return {
            "tool_calls": self.calls,
            "tool_errors": self.errors + self.parse_errors + self.unknown_tools,
            "tool_parse_errors": self.parse_errors,
            "tool_timeouts": self.timeouts,
        }


class ToolEnv(AgentEnv):
    """An episode: a system prompt, a task, tools; ends on finish (or no call)."""

    def __init__(
        self,
        tools: list[Tool],
        task: str,
        system_prompt: str = "You are a helpful assistant that solves the task with the tools provided.",
        tokenizer: Tokenizer | None = None,
        config: ToolEnvConfig | None = None,
    ) -> None:
        names = [t.name for t in tools]
        if len(set(names)) != len(names):
            raise ValueError(f"tool names must be unique, got {names}")
        self.config = config or ToolEnvConfig()
        self.tool_format = self.config.tool_format
        self.by_name: dict[str, Tool] = dict(zip(names, tools))
        self.task = task
        shown = [t.schema for t in tools]
        if self.tool_format == "bash_block":
            if "bash" not in self.by_name:
                raise ValueError("tool_format bash_block needs a tool named 'bash'")
            shown = [self.by_name["bash"].schema]  # the only tool a bash block can call
        self.tool_schemas = template_tools(shown)  # ChatCompletion shape
        self.presentation = present_tools(shown, system_prompt, tokenizer, self.config.tools_in, self.tool_format)
        # What run_agent_loop hands the chat template: None when the section is in
        # the system prompt already (the template cannot render it).
        self.tools = self.presentation.template_tools
        self.stats = ToolStats()
        self.finished = False
        self.answer: str | None = None

    def initial_messages(self) -> list[Message]:
        return [
            {"role": "system", "content": self.presentation.system_prompt},
            {"role": "user", "content": self.task},
        ]

    def parse(self, reply: str) -> ParsedReply:
        """The calls ``reply`` makes, in this episode's tool format."""
        return parse_tool_calls(reply, self.tool_format)

    def counts(self) -> dict[str, int]:
        return self.stats.as_stats()

    def calls_in(self, reply: str) -> list[ToolCallRecord]:
        return [{"name": call.name, "arguments": call.arguments, "id": None} for call in self.parse(reply).calls]

    async def stop(self) -> None:
        """Interrupt what every tool still runs (the episode's time limit cut a call)."""
        for tool in self.by_name.values():
            await tool.interrupt()

    async def step(self, reply: str) -> Step:
        parsed = self.parse(reply)
        if not parsed.has_calls:
            self.stats.no_call_replies += 1
            if self.config.on_no_call == "end":
                return Step(done=True, reason="no_tool_call")
            nudge = self.config.nudge_message or NUDGES[self.tool_format]
            return Step(messages=[{"role": "user", "content": nudge}])
        # Every call the reply makes is recorded on its turn, run or not.
        calls: list[ToolCallRecord] = [
            {"name": call.name, "arguments": call.arguments, "id": None} for call in parsed.calls
        ]
        messages: list[Message] = []
        limit = self.config.max_calls_per_turn
        for n, item in enumerate(parsed.items):
            if n >= limit:
                skipped = len(parsed.items) - n
                self.stats.errors += skipped
                messages.append(
                    self._message(
                        f"Error: only {limit} tool calls are run per reply; the last {skipped} were not run.", None
                    )
                )
                break
            if isinstance(item, MalformedCall):
                self.stats.parse_errors += 1
                messages.append(self._message(item.message, None))
                continue
            outcome = await self._run(item.name, item.arguments)
            messages.append(self._message(outcome.text, item.name))
            if self.tool_format == "bash_block" and not outcome.error:
                submission = submitted_output(outcome.text)
                if submission is not None:
                    await self._submit(submission)
            if self.finished:
                return Step(messages=messages, done=True, reason="finished", tool_calls=calls)
        return Step(messages=messages, tool_calls=calls)

    async def _submit(self, output: str) -> None:
        """``bash_block``'s submit marker: the finishing tool, if any, takes the output
        (a FinishTool's ``collect`` may compute the real submission, e.g. a patch)."""
        finish = next((t for t in self.by_name.values() if isinstance(t, FinishingTool)), None)
        if finish is not None:
            await self._run(finish.name, finish.submission(output))
        if not self.finished:  # no finishing tool (or it refused): the output is the answer
            self.finished, self.answer = True, output

    async def _run(self, name: str, arguments: dict[str, Any]) -> ToolOutcome:
        tool = self.by_name.get(name)
        if tool is None:
            self.stats.unknown_tools += 1
            return ToolOutcome(
                text=f"Error: there is no tool named {name!r}; the tools are: {', '.join(self.by_name)}.",
                error=True,
            )
        self.stats.calls += 1
        self.stats.by_tool[name] = self.stats.by_tool.get(name, 0) + 1
        outcome = await call_tool(tool, arguments, self.config.call_timeout)
        self.stats.seconds += outcome.seconds
        self.stats.errors += outcome.error
        self.stats.timeouts += outcome.timed_out
        if isinstance(tool, FinishingTool) and tool.finished:  # finish, submit
            self.finished = True
            self.answer = tool.answer
        return outcome

    def _message(self, text: str, name: str | None) -> Message:
        text, _ = truncate_middle(text, self.config.max_result_chars)
        return tool_message(text, name, wrap=self.presentation.wrap_responses)
