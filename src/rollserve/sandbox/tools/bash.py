"""A persistent bash on a PTY inside a sandbox, driven by events, not polling.

How a command runs:

- bash is interactive (job control: every foreground command gets its own process
  group, so C-c reaches the command and not the shell) and reads a terminal in
  canonical mode without readline (``--noediting``: a tab is a tab, not completion).
- The command goes in as ONE line, ``__rs_seq=N; jobs; eval $'...' 2>&1`` (ANSI-C
  quoted, every control byte escaped), so multi-line commands, heredocs and
  unbalanced quotes are one unit: a syntax error is an error, never a shell left
  waiting for more input. Lines longer than the terminal's 4095-byte line limit are
  sent in chunks inside a ``{ ...; }`` group, which runs only when complete.
- Job notices (``[1]+ Done ...``, ``Terminated``) of earlier commands never show in a
  later command's output: the shell's own stderr is /dev/null (a command's stderr is
  the terminal, ``2>&1`` on its ``eval``), and each command line first takes, silently,
  the notices of jobs that ended before it (``jobs >/dev/null``).
- The prompt is the completion marker: before each prompt ``PROMPT_COMMAND`` prints
  ``RS <nonce>:<seq>:<exit code> RS`` (RS = \\x1e; PS1 itself is empty). The nonce
  is per session, ``seq`` per command, so an old prompt (a C-c that raced a
  finishing command) is never taken for the current one. The marker is matched
  on the raw byte stream with bytes held back across reads, so a marker split
  between two reads is still found.
- The output is read with ``await process.read()``: one wake-up per chunk, no sleep,
  no poll. One timer per call covers the hard timeout, the no-output (idle)
  timeout and the input check (shell_read.py); the limit it was armed for is the
  outcome when it fires.
- A command silent for ``input_wait`` seconds is checked for waiting on terminal
  input (terminal_input.py: exact from /proc where the runtime allows, else a prompt
  left without a newline); if it waits, the call returns with it running, to be
  answered with ``send``. A silent command that is not reading runs on.
- On timeout (or an output flood) the command is interrupted: C-c, then SIGKILL to
  the terminal's foreground process group, then, as a last resort, a fresh shell.
- Background jobs (``&``) never hold a call: only the marker ends it, not EOF.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import shlex
import signal
import time
from collections.abc import Sequence
from typing import Literal

from rollserve.sandbox.base import Sandbox, SandboxError, SandboxProcess
from rollserve.sandbox.tools.bash_config import DEFAULT_ENV, BashBusy, BashConfig, BashResult
from rollserve.sandbox.tools.keys import key_bytes
from rollserve.sandbox.tools.shell_read import Limits, Outcome, marker_arrives, read_until
from rollserve.sandbox.tools.shell_wire import (
    JobNotices,
    MarkerScanner,
    init_line,
    quote_command,
    shell_pid,
    signal_foreground,
)
from rollserve.sandbox.tools.terminal_input import TerminalProbe, looks_like_a_prompt
from rollserve.sandbox.tools.text import HeadTail

__all__ = ["DEFAULT_ENV", "BashBusy", "BashConfig", "BashResult", "BashSession"]

SETTLE = 0.05  # how long to look for the end of a command that returned early


class BashSession:
    """One persistent shell. ``run`` a command; ``send`` text or keys to a running one."""

    def __init__(self, sandbox: Sandbox, config: BashConfig | None = None):
        self.sandbox = sandbox
        self.config = config or BashConfig()
        self.process: SandboxProcess | None = None
        self._nonce = secrets.token_hex(8)  # only this session's prompts match
        self._scanner = MarkerScanner(self._nonce)
        self._probe: TerminalProbe | None = None
        self._notices = JobNotices()
        self._seq = 0
        self._running = False  # a command is in progress (returned early, or cancelled)
        self._needs_sync = False  # a signal key was sent: sync before the next command
        self._abandoned = False  # a call was cancelled while its command ran
        self._lock = asyncio.Lock()

    # --- lifetime ------------------------------------------------------------------------
    async def start(self) -> None:
        env = {**self.config.env}
        self.process = await self.sandbox.spawn(list(self.config.shell), pty=True, env=env)
        self._scanner.pending.clear()
        self._notices.reset()
        self._running = self._needs_sync = self._abandoned = False
        self._seq += 1
        cd = f"cd {shlex.quote(self.config.cwd)}; " if self.config.cwd else ""
        init = init_line(self._nonce, self._seq, cd)
        sink = HeadTail(4096, 4096)
        deadline = asyncio.get_running_loop().time() + self.config.start_timeout
        try:
            await self.process.write(init)
            outcome, _ = await self._wait(sink, deadline=deadline, idle=None, expect=None)
        except BaseException:  # cancelled (or broken) half-way: no half-set-up shell stays
            self._drop_process()
            raise
        if outcome != "done":
            await self._kill_process()
            raise SandboxError(f"bash did not start in the sandbox ({outcome}): {sink.text()[-500:]!r}")
        pid = shell_pid(sink.text())
        self._probe = TerminalProbe(self.process.pid, pid) if pid is not None else None
        if self._probe is not None:
            self._probe.host_pid()  # found now, while the shell has no children

    async def close(self) -> None:
        await self._kill_process()

    def _shell(self) -> SandboxProcess:
        """The running shell; a SandboxError once it has been killed (closed, or lost)."""
        if self.process is None:
            raise SandboxError("the bash session has no shell (closed, or it died)")
        return self.process

    def _drop_process(self) -> None:
        """Kill the shell without awaiting (for paths that are being cancelled)."""
        process, self.process = self.process, None
        if process is None:
            return
        process.kill_now()  # synchronous SIGKILL; the runtime reaps it when it exits
        process.close()  # our end of the PTY

    async def _kill_process(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            try:
                await process.kill()
            except Exception:  # already gone, or its sandbox closed under it
                pass

    async def __aenter__(self) -> BashSession:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- commands ----------------------------------------------------------------------
    async def run(
        self,
        command: str,
        timeout: float | None = None,
        idle_timeout: float | None | Literal["default"] = "default",
        expect: str | None = None,
    ) -> BashResult:
        """Run ``command`` to completion, or until ``expect`` (a regex) shows in its
        output or it waits for terminal input (then ``running`` is true and ``send``
        answers it). On a hard or idle timeout the command is interrupted and the
        shell kept."""
        async with self._lock:
            started = time.perf_counter()
            notes = await self._ensure_ready()
            if self._abandoned:
                notes += await self._recover()
            if self._running:
                notes += await self._end_of_previous()
            if self._needs_sync:
                notes += await self._sync()
            self._seq += 1
            self._running = True
            await self._shell().write(quote_command(command, self._seq))
            idle = self.config.idle_timeout if idle_timeout == "default" else idle_timeout
            limit = timeout or self.config.timeout
            return await self._finish(started, limit, idle, expect, notes, interrupt=True)

    async def send(
        self,
        text: str = "",
        keys: Sequence[str] = (),
        expect: str | None = None,
        timeout: float | None = None,
    ) -> BashResult:
        """Type ``text`` then ``keys`` (names: "C-c", "C-d", "Enter", "Up", ...) into
        the running command; return when it ends, ``expect`` shows, it waits for input
        again, or after ``timeout`` (the command then keeps running). Nothing to type:
        just wait for more output."""
        async with self._lock:
            started = time.perf_counter()
            if self.process is None or not self._running:
                return BashResult("", None, 0.0, notes=["no command is running; nothing was sent"])
            data = text.encode() + b"".join(key_bytes(k) for k in keys)
            if data and await self._settle():  # it ended: what we type would go to the shell
                result = await self._finish(started, self.config.interrupt_grace, None, None, [], interrupt=False)
                result.notes.append("the command had already ended; nothing was sent")
                return result
            if data:
                await self._write_keys(data)
            limit = timeout or self.config.send_timeout
            return await self._finish(started, limit, None, expect, [], interrupt=False)

    async def interrupt(self) -> BashResult:
        """Stop the running command (C-c, then harder); the shell stays."""
        async with self._lock:
            started = time.perf_counter()
            if self.process is None or not self._running:
                return BashResult("", None, 0.0, notes=["no command is running"])
            sink = HeadTail(self.config.max_output_bytes // 2, self.config.max_output_bytes // 2)
            result = BashResult(output="", exit_code=None, seconds=0.0)
            await self._stop(sink, result)
            result.output = self._notices.clean(sink.text())
            result.seconds = time.perf_counter() - started
            return result

    @property
    def running(self) -> bool:
        return self._running

    # --- internals --------------------------------------------------------------------
    async def _ensure_ready(self) -> list[str]:
        """A live shell: start one if there is none (first call, or the last one exited)."""
        if self.process is not None and self.process.returncode is not None:
            await self._kill_process()  # died between calls (killed, out of memory, ...)
        if self.process is not None:
            return []
        restarted = self._seq > 0
        await self.start()
        if restarted:
            return ["the previous shell had ended; this is a new shell (cwd and variables were reset)"]
        return []

    async def _finish(
        self,
        started: float,
        limit: float,
        idle: float | None,
        expect: str | None,
        notes: list[str],
        interrupt: bool,
    ) -> BashResult:
        sink = HeadTail(self.config.max_output_bytes // 2, self.config.max_output_bytes // 2)
        pattern = re.compile(expect) if expect else None
        deadline = asyncio.get_running_loop().time() + limit
        try:
            outcome, code = await self._wait(sink, deadline, idle, pattern, command=True)
        except BaseException:
            # Cancelled mid-command (the tool call's own timeout, a cancelled rollout).
            # Nothing can be awaited now; the next call stops what is left running.
            self._abandoned = self._running
            raise
        result = BashResult(output="", exit_code=code, seconds=0.0, notes=list(notes))
        if outcome == "done":
            self._running = self._abandoned = False
        elif outcome == "expect":
            result.running = True
        elif outcome == "input":
            result.running = result.waiting_for_input = True
            result.notes.append("the command is waiting for input (it is still running)")
        elif outcome == "eof":
            await self._on_shell_exit(result)
        elif outcome != "flood" and not interrupt:  # send(): the command runs on; the model decides
            result.running = True
            result.notes.append(f"still running after waiting {limit:g} s for output to finish")
        elif outcome == "idle" and self.config.idle_action == "return":
            result.running = True
            result.notes.append(
                f"no output for {idle:g} s; the command is still running "
                "(it may be waiting for input): send input or keys, or interrupt it"
            )
        else:
            result.timed_out = outcome in ("timeout", "idle")
            if outcome == "timeout":
                what = f"did not finish within {limit:g} s"
            elif outcome == "idle":
                what = f"printed nothing for {idle:g} s"
            else:
                what = f"printed more than {self.config.flood_bytes} bytes"
            result.notes.append(f"the command {what}")
            await self._stop(sink, result)
        result.output = self._notices.clean(sink.text())
        result.truncated = sink.dropped > 0
        result.dropped_bytes = sink.dropped
        result.seconds = time.perf_counter() - started
        return result

    async def _settle(self) -> bool:
        """Whether the command that returned early (at ``expect``, waiting for input)
        has ended since: its marker, or the shell's end, is already on the way."""
        return await marker_arrives(self._shell(), self._scanner, self._seq, SETTLE)

    async def _end_of_previous(self) -> list[str]:
        """``run`` while the last command returned early: if it has ended meanwhile,
        collect its end (and say so); if it still runs, refuse."""
        if not await self._settle():
            raise BashBusy("a command is still running; send it input or keys, or interrupt it")
        sink = HeadTail(1000, 1000)
        loop = asyncio.get_running_loop()
        outcome, code = await self._wait(sink, loop.time() + self.config.interrupt_grace, None, None)
        printed = self._notices.clean(sink.text()).strip()
        tail = f"; it printed before ending: {printed}" if printed else ""
        if outcome == "done":
            self._running = False
            return [f"the previous command ended (exit code {code}){tail}"]
        result = BashResult(output="", exit_code=None, seconds=0.0)
        await self._on_shell_exit(result)
        return [*result.notes, *await self._ensure_ready()]

    async def _recover(self) -> list[str]:
        """Stop the command a cancelled call left running, keeping the shell if we can."""
        result = BashResult(output="", exit_code=None, seconds=0.0)
        try:
            await self._stop(HeadTail(1024, 1024), result)
        except (OSError, SandboxError):  # the shell broke under the cancelled call
            await self._kill_process()
            await self.start()
            result.shell_restarted = True
        if result.shell_restarted:
            return [
                "the previous call was cancelled and its shell could not be recovered; "
                "this is a new shell (cwd and variables were reset)"
            ]
        return ["the previous call was cancelled before its command finished; that command was stopped"]

    async def _stop(self, sink: HeadTail, result: BashResult) -> None:
        """Interrupt the foreground command, harder at each step, until the prompt returns."""
        result.interrupted = True
        self._abandoned = False
        loop = asyncio.get_running_loop()
        steps = [("sent C-c", self._send_ctrl_c), ("killed the foreground process group", self._kill_foreground)]
        for description, action in steps:
            if not await action():
                continue
            # Output goes on into the same sink (bounded), unchecked for a flood: the
            # command is being stopped, and its last output is what the model sees.
            outcome, code = await self._wait(sink, loop.time() + self.config.interrupt_grace, None, None)
            if outcome == "done":
                result.exit_code = code
                result.notes.append(f"interrupted: {description}")
                self._running = False
                self._needs_sync = True  # the killed program may have left the terminal raw
                return
            if outcome == "eof":
                await self._on_shell_exit(result)
                return
        result.notes.append(
            "the command could not be interrupted; the shell was replaced by a new one (cwd and variables were reset)"
        )
        result.exit_code = None
        result.shell_restarted = True
        await self._kill_process()
        await self.start()

    async def _send_ctrl_c(self) -> bool:
        await self._write_keys(b"\x03")
        return True

    async def _write_keys(self, data: bytes) -> None:
        if any(key in data for key in (b"\x03", b"\x1a", b"\x1c")):
            self._needs_sync = True
        await self._shell().write(data)

    async def _kill_foreground(self) -> bool:
        return signal_foreground(self._shell(), signal.SIGKILL)

    async def _sync(self) -> list[str]:
        """Make sure the shell is at a prompt and reads our next line, after we sent a
        signal key (C-c, C-z, C-\\). Such a key can land after the command it was meant
        for ended; bash then drops whatever input line it has buffered, which could
        be our next command. So first a no-op round trip, repeated until its marker
        comes back; it also resets the terminal a killed program may have left raw."""
        loop = asyncio.get_running_loop()
        grace = self.config.interrupt_grace
        # The first wait is short: an eaten line is the common failure, resent at once.
        for wait in (min(0.25, grace), grace, grace):
            self._seq += 1
            await self._shell().write(quote_command("stty sane -echo -onlcr 2>/dev/null", self._seq))
            outcome, _ = await self._wait(HeadTail(1024, 1024), loop.time() + wait, None, None)
            if outcome == "done":
                self._needs_sync = False
                return []
            if outcome == "eof":
                break
        await self._kill_process()
        await self.start()
        return [
            "the shell did not answer after an interrupt and was replaced by a new one (cwd and variables were reset)"
        ]

    async def _on_shell_exit(self, result: BashResult) -> None:
        code = await self.process.wait(1.0) if self.process else None
        result.exit_code = code
        result.shell_restarted = True
        result.notes.append("the shell exited; the next command starts a new shell (cwd and variables will be reset)")
        self._running = False
        await self._kill_process()

    async def _waits_for_input(self, output: str) -> bool:
        verdict = None
        if self._probe is not None:  # in a thread: /proc reads must not stall the loop
            verdict = await asyncio.to_thread(self._probe.waiting_for_input)
        if verdict is None:  # the kernel cannot tell here: a prompt left open is the sign
            return looks_like_a_prompt(output)
        return verdict

    async def _wait(
        self,
        sink: HeadTail,
        deadline: float | None,
        idle: float | None = None,
        expect: re.Pattern[str] | None = None,
        command: bool = False,
    ) -> tuple[Outcome, int | None]:
        """Read until this command's marker, ``expect``, a limit, or EOF. With
        ``command`` (the command's own wait, not an interrupt's or a sync's) also
        until a flood, or until it waits for terminal input."""
        limits = Limits(
            deadline,
            idle,
            expect,
            flood_bytes=self.config.flood_bytes if command else None,
            input_wait=self.config.input_wait if command else None,
        )
        return await read_until(self._shell(), self._scanner, self._seq, sink, limits, self._waits_for_input)
