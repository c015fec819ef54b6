"""Reading a shell's terminal until its command ends, or a limit comes first.

One timer per wait (``asyncio.timeout``, rescheduled on each chunk) covers every
limit: the hard deadline, the no-output (idle) timeout, and the input check. The
timer is always armed for the earliest of them, and that limit is the outcome when
it fires: the outcome is never guessed back from the clock.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from rollserve.sandbox.base import SandboxProcess
from rollserve.sandbox.tools.shell_wire import MarkerScanner
from rollserve.sandbox.tools.text import HeadTail, clean_terminal_text

READ_CHUNK = 1 << 16
# After the input check says "reading the terminal", output still in flight (the
# prompt marker of a command that just ended, then the shell reading its next line)
# gets this long to arrive before the wait ends as waiting for input.
INPUT_CONFIRM = 0.1

Outcome = Literal["done", "expect", "input", "timeout", "idle", "flood", "eof"]


@dataclass
class Limits:
    deadline: float | None = None  # event-loop time: the hard timeout
    idle: float | None = None  # seconds without output
    expect: re.Pattern[str] | None = None  # shows in the output
    flood_bytes: int | None = None  # more output than this
    input_wait: float | None = None  # silent this long: is it waiting for input?


async def read_until(
    process: SandboxProcess,
    scanner: MarkerScanner,
    seq: int,
    sink: HeadTail,
    limits: Limits,
    waits_for_input: Callable[[str], Awaitable[bool]] | None = None,
) -> tuple[Outcome, int | None]:
    """Read until command ``seq``'s marker (``"done"`` and its exit code), EOF, or
    the first of ``limits``. ``waits_for_input`` gets the output so far (this wait's
    last few KB) each time the command has been silent for ``limits.input_wait``."""
    loop = asyncio.get_running_loop()
    reading = _Reading(scanner, seq, sink, limits, loop)
    # Bytes read by an earlier wait (output of a background job, a stale prompt).
    if scanner.pending:
        found = scanner.scan(seq, sink, reading.recent)
        if found is not None:
            return "done", found
    while True:
        when, why = reading.next_limit()
        try:
            async with asyncio.timeout_at(when) as timer:
                while True:
                    ended = reading.take(await process.read(READ_CHUNK))
                    if ended is not None:
                        return ended
                    when, why = reading.next_limit()
                    timer.reschedule(when)
        except TimeoutError:
            pass
        if why != "check":
            scanner.commit(sink, reading.recent)  # a marker cut short now never completes
            return why, None
        reading.checked = loop.time()
        if waits_for_input is not None and await waits_for_input(reading.text()):
            reading.confirm_at = loop.time() + INPUT_CONFIRM


class _Reading:
    """One wait's state: the output since it began, when output last came, when the
    input check last ran and when its "yes" ends the wait unless output comes first."""

    def __init__(
        self, scanner: MarkerScanner, seq: int, sink: HeadTail, limits: Limits, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.scanner, self.seq, self.sink, self.limits, self.loop = scanner, seq, sink, limits, loop
        self.recent = bytearray()  # the last few KB since this wait began
        self.last_output = self.checked = loop.time()
        self.confirm_at: float | None = None  # the input check said yes: end then, unless output comes

    def next_limit(self) -> tuple[float | None, Outcome | Literal["check"]]:
        """The earliest limit: when it comes, and the outcome (or the input check) it is."""
        limits = self.limits
        due: list[tuple[float, Outcome | Literal["check"]]] = []
        if limits.deadline is not None:
            due.append((limits.deadline, "timeout"))
        if limits.idle:
            due.append((self.last_output + limits.idle, "idle"))
        if self.confirm_at is not None:
            due.append((self.confirm_at, "input"))
        elif limits.input_wait:
            due.append((max(self.last_output, self.checked) + limits.input_wait, "check"))
        return min(due) if due else (None, "timeout")

    def text(self) -> str:
        return clean_terminal_text(self.recent.decode("utf-8", "replace"))

    def take(self, chunk: bytes) -> tuple[Outcome, int | None] | None:
        """A chunk read (empty: EOF): how it ends the wait, or None to read on (output
        came: the idle clock restarts, an input check's "yes" is void)."""
        if not chunk:
            self.scanner.commit(self.sink, self.recent)
            return "eof", None
        self.scanner.pending += chunk
        found = self.scanner.scan(self.seq, self.sink, self.recent)
        if found is not None:
            return "done", found
        if self.limits.expect is not None and self.limits.expect.search(self.text()):
            return "expect", None
        if self.limits.flood_bytes is not None and self.sink.total > self.limits.flood_bytes:
            return "flood", None
        self.last_output, self.confirm_at = self.loop.time(), None
        return None


async def marker_arrives(process: SandboxProcess, scanner: MarkerScanner, seq: int, within: float) -> bool:
    """Whether command ``seq``'s marker (or the end of output) is read within
    ``within`` seconds; what is read stays pending for the next wait."""
    try:
        async with asyncio.timeout(within):
            while not scanner.has_marker(seq):
                chunk = await process.read(READ_CHUNK)
                if not chunk:
                    return True
                scanner.pending += chunk
    except TimeoutError:
        return False
    return True
