"""What handlers whose RUN is an agent harness behind the recording gateway share
(the ``gateway`` family, and the ``harness`` option of the ``swe`` family).

- ``gateway_session``: the rollout's gateway session (``agent.gateway``), open for
  the block's duration under a fresh key; when the block ends (normally, on error or
  on cancel) the key is closed and the session's time and counters are charged to
  the rollout (``timing.llm``, ``timing.harness``, ``stats.gateway_calls``,
  ``stats.context_refusals``) and its ``ended_by`` becomes the trajectory's.
- ``run_in_sandbox``: a harness command run INSIDE a sandbox (no network) under the
  ``forwarder`` (``agent/gateway/forwarder.py``), which serves the session's unix
  socket (in the sandbox's server folder, mounted read-only at ``/.rollserve``) on 127.0.0.1 of the sandbox's own
  network namespace and sets ``OPENAI_BASE_URL`` and ``ANTHROPIC_BASE_URL``;
  ``OPENAI_API_KEY`` and ``ANTHROPIC_API_KEY`` are the session's key (the socket
  refuses any other rollout's key) and ``ROLLSERVE_PYTHON`` the python the forwarder
  runs on. It returns when the command exits, the session ends
  (``max_turns``) or the time limit comes; the command and everything it started in
  its process group is killed then, the socket closed. The socket is bound in the
  sandbox's server folder (``Sandbox.server_folder``: the server's alone, read-only
  inside, never the workspace): nothing in the sandbox (the policy's own commands
  under the harness included) can remove it or put its own server at its path for
  the forwarder to reach. A harness that ended before
  the policy answered any call (it crashed at start, say) fails the rollout as
  infrastructure (``InfraError``, masked): nothing the policy produced exists to
  score, and the policy cannot act before its first call.

  Memory: a harness sandbox's limits are ``harness_limits`` (``memory_mode``
  "resident"): where no cgroup bounds it, the sandbox's processes together are held
  under ``memory_mb`` of resident memory (``sandbox/rsscap.py``), not each under an
  address-space limit that JavaScript runtimes (Node, Bun) break on at start. Past
  the cap every process of the sandbox is killed, the harness with them; that ends
  the rollout as the agent's failure (``AgentError``, scored 0) once the policy has
  answered a call (what it ran filled the memory, as a test run past its CPU budget
  is its failure), and as infrastructure (masked) before that (the harness alone
  does not fit its cap: a configuration problem, as any harness that ends first).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from rollserve.agent.gateway import SOCKET_NAME, GatewayLimits, GatewaySession, NoCallError, SessionSocket
from rollserve.contract.calls import GatewayCalls
from rollserve.errors import AgentError, InfraError
from rollserve.handlers.base import HandlerContext, RolloutView
from rollserve.sandbox.base import Sandbox, SandboxLimits, SandboxProcess

__all__ = ["FORWARDER", "LOG_TAIL", "HarnessOutput", "gateway_session", "harness_limits", "run_in_sandbox"]

FORWARDER = (Path(__file__).parents[1] / "agent" / "gateway" / "forwarder.py").read_text()
LOG_TAIL = 4000  # characters of the harness's output kept for the evaluation
NO_CALL_TAIL = 1500  # characters of it in the failure of a harness that never called


def harness_limits(limits: SandboxLimits | None = None) -> SandboxLimits:
    """``limits`` (default: the defaults) for the sandbox a harness runs in: its memory
    capped as resident memory for the whole sandbox (see the module's doc)."""
    return (limits or SandboxLimits()).model_copy(update={"memory_mode": "resident"})


@dataclass
class HarnessOutput:
    """What a harness command left: its exit status (None: it was killed or never
    ran) and the tail of its output (stdout and stderr together)."""

    exit_code: int | None = None
    cap: str | None = None  # the sandbox cap that killed it ("memory", "disk"), if one did
    chunks: list[str] = field(default_factory=list)
    kept: int = 0  # characters in chunks

    def tail(self) -> str:
        return "".join(self.chunks)[-LOG_TAIL:]

    def keep(self, text: str) -> None:
        self.chunks.append(text)
        self.kept += len(text)
        while self.kept > 2 * LOG_TAIL and len(self.chunks) > 1:
            self.kept -= len(self.chunks.pop(0))


@contextlib.asynccontextmanager
async def gateway_session(
    ctx: HandlerContext, rollout: RolloutView, *, parse_tool_calls: bool, calls: GatewayCalls | None = None
) -> AsyncIterator[tuple[GatewaySession, str]]:
    """(the rollout's gateway session, its key), open in the server's gateway for the
    block; ``InfraError`` where the server has no gateway or the rollout no LLM.
    ``calls`` tells the harness's main-loop calls from its auxiliary ones (None: every
    call is the main loop's)."""
    gateway = ctx.gateway
    if gateway is None:
        raise InfraError("this server has no gateway: a harness cannot run")
    if rollout.llm is None:
        raise InfraError("no LLM session was attached to the rollout before RUN")
    limits = GatewayLimits(
        sampling=rollout.sampling,
        max_turns=rollout.max_turns,
        max_context_tokens=rollout.max_context_tokens,
        deadline=rollout.agent_deadline(asyncio.get_running_loop().time()),
        parse_tool_calls=parse_tool_calls,
        calls=calls or GatewayCalls(),
    )
    session = GatewaySession(rollout.id, rollout.llm, ctx.tokenizer, rollout.trajectory, limits)
    key = gateway.open(session)
    try:
        yield session, key
    finally:
        gateway.close(session)
        rollout.trajectory.ended_by = session.ended_by
        rollout.add_time("llm", session.stats.llm_seconds)
        rollout.add_time("harness", session.stats.env_seconds)
        rollout.add_stats(
            {
                "gateway_calls": session.calls,
                "auxiliary_calls": len(rollout.trajectory.auxiliary),
                "context_refusals": session.context_refusals,
            }
        )


async def run_in_sandbox(
    sandbox: Sandbox,
    session: GatewaySession,
    key: str,
    command: str,
    python: str,
    env: dict[str, str],
    output: HarnessOutput,
) -> None:
    """``bash -c command`` in ``sandbox`` under the forwarder (on ``python``, with
    ``env``), until it exits, the session ends, or the time limit (``session.wait``);
    then it is killed and the socket closed. Its output and exit status go to
    ``output``."""
    folder = sandbox.server_folder()
    if folder is None:
        raise InfraError(
            f"the {sandbox.runtime} sandbox has no folder only the server writes: "
            "the gateway's socket cannot be put where the harness alone reaches it"
        )
    host_folder, inside = folder
    server = SessionSocket(session, host_folder, key=key)
    await server.start()
    process: SandboxProcess | None = None
    watcher: asyncio.Task[None] | None = None
    try:
        process = await sandbox.spawn(
            [python, "-c", FORWARDER, f"{inside}/{SOCKET_NAME}", "--", "bash", "-c", command],
            env={**env, "OPENAI_API_KEY": key, "ANTHROPIC_API_KEY": key, "ROLLSERVE_PYTHON": python},
        )
        watcher = asyncio.create_task(_watch(process, session, output))
        with contextlib.suppress(NoCallError):  # said below, with the harness's exit code
            await session.wait()
    finally:
        if process is not None:
            await process.kill()
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        await server.close()
    output.cap = process.cap if process is not None else None
    memory = (
        f"memory limit: the sandbox's processes together passed its memory cap "
        f"({sandbox.spec.limits.memory_mb} MB) and were all killed, the harness with "
        "them"
        if output.cap == "memory"
        else None
    )
    if session.calls == 0:  # (a policy's action needs a call first: it cannot buy this mask)
        why = f"{memory} " if memory else ""
        raise InfraError(
            f"{why}the harness ended (exit code {output.exit_code}) before the "
            "policy answered any call: nothing was sampled to score; its output "
            "ends: " + output.tail()[-NO_CALL_TAIL:]
        )
    if memory:  # (after the policy's calls: what it ran did it, as a test run's CPU budget)
        raise AgentError(f"{memory}; the harness's output ends: {output.tail()[-NO_CALL_TAIL:]}")


async def _watch(process: SandboxProcess, session: GatewaySession, output: HarnessOutput) -> None:
    """Keep the harness's output (its tail) and end the session when it exits."""
    while chunk := await process.read():
        output.keep(chunk.decode("utf-8", "replace"))
    output.exit_code = await process.wait()
    session.finish("finished")
