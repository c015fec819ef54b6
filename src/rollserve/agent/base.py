"""The agent layer's contracts: what a handler gives the agent loop, and what a tool is.

- ``AgentEnv``: the environment of one episode. Its opening messages, and for each
  assistant reply a ``Step`` (the user or tool messages that answer it, whether the
  episode is over, and the tool calls it read in the reply, which the loop records on
  the reply's turn). Tools it offers are declared here too: how the chat template is
  given them (``tools``), what the result records (``tool_schemas``) and how the
  model writes its calls (``tool_format``). ``agent.tool_env.ToolEnv`` is the one
  for tool-using episodes.
- ``Tool``: a JSON schema and an async call answering with text (``agent.tools``:
  calling with argument checks and a timeout). A ``FinishingTool`` (finish, submit)
  is one whose successful call ends the episode with an answer.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

from rollserve.agent.tool_calls import ToolFormat
from rollserve.llm.base import Message as Message  # the chat message: the llm layer's type

# Why an episode ended (the trajectory's ``ended_by``): the environment's reason
# (``Step.reason``: it finished, or a reply called no tool), the last turn, no room
# left in the context, or the agent's time limit while its tools ran. The result
# contract keeps ``ended_by`` a plain string, so a client accepts a reason added here.
EndedBy = Literal["finished", "no_tool_call", "max_turns", "context_exhausted", "time_limit"]


class ToolCallRecord(TypedDict):
    """One tool call of an assistant reply, as the turn records it."""

    name: str
    arguments: dict[str, Any] | str  # a string when a chat API's arguments are not a JSON object
    id: str | None  # a chat API's call id; None for calls written in the text


@dataclass
class Step:
    """What the environment answers to one assistant reply."""

    messages: list[Message] = field(default_factory=list)  # new user/tool messages
    done: bool = False
    reason: EndedBy = "finished"
    tool_calls: list[ToolCallRecord] = field(default_factory=list)  # the calls read in the reply


class AgentEnv(ABC):
    """One episode's environment. A tool-less env keeps the defaults below."""

    # The tools as the chat template (or a chat API) is given them; None when there
    # are none, or when they are described in the system prompt instead.
    tools: list[dict[str, Any]] | None = None
    # The tools the agent is offered, in ChatCompletion shape, for the result.
    tool_schemas: list[dict[str, Any]] | None = None
    # How the model writes its calls, so a chat API's structured calls are written
    # back the same way for ``step``.
    tool_format: ToolFormat = "hermes"

    @abstractmethod
    def initial_messages(self) -> list[Message]:
        """The episode's opening messages (system prompt, task)."""

    @abstractmethod
    async def step(self, reply: str) -> Step:
        """Answer the assistant's ``reply``."""

    def counts(self) -> dict[str, int]:
        """Counts for the rollout's stats (a ToolEnv's tool calls and errors)."""
        return {}

    def calls_in(self, reply: str) -> list[ToolCallRecord]:
        """The tool calls ``reply`` makes, for a turn whose step was cut (the time
        limit) before it answered; none by default."""
        return []

    async def stop(self) -> None:  # noqa: B027 (an optional hook; doing nothing is right)
        """The episode was cut in the middle of a step (its time limit): stop what the
        tools still run (the loop bounds the wait). Nothing by default."""


class Tool(ABC):
    """A tool the agent calls: ``schema`` (``{"name", "description", "parameters"}``,
    see ``agent.tools.function_schema``) and an async call with the checked arguments.

    A failure the model should read is a ``ToolError``; an ``InfraError`` (the
    sandbox died) fails the rollout, masked.
    """

    schema: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.schema["name"])

    @abstractmethod
    async def __call__(self, args: dict[str, Any]) -> str:
        """Run the call; the text the model reads."""

    async def close(self) -> None:
        """End what the tool opened (a shell, a kernel); nothing by default."""
        return None

    async def interrupt(self) -> None:  # noqa: B027 (an optional hook; doing nothing is right)
        """Stop what a cancelled call left running (a command in the shell); nothing
        by default."""


class FinishingTool(Tool):
    """A tool whose successful call ends the episode with an answer (finish, submit):
    the call sets ``finished`` and ``answer``."""

    finished: bool = False
    answer: str | None = None

    def submission(self, output: str) -> dict[str, Any]:
        """The arguments that submit ``output`` (the ``bash_block`` format's submit
        marker calls the episode's finishing tool with them); by default none."""
        return {}
