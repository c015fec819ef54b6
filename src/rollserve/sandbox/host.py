"""Host commands run to completion, and the binaries runtimes run.

``find_binary`` is the one way a runtime (or ``rollserve images``) finds its binary
on PATH, and ``missing_binary`` the one way it says what to install; ``setpriv_argv``
runs what follows as another uid. ``collect()``
drives a started ``HostProcess`` as a one-shot command: stdin in, stdout and stderr
out (each capped, head and tail kept), killed with its whole group at the timeout.
``run_command()`` is start + collect.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Awaitable, Callable, Sequence

from rollserve.sandbox.base import ExecResult
from rollserve.sandbox.process import READ_CHUNK, HostProcess

# After a one-shot command exits and its group is killed, wait this long for the
# pipes to reach EOF; a process that left the group (setsid) may hold them forever.
DRAIN_GRACE = 1.0


def find_binary(names: Sequence[str]) -> str | None:
    """The first of ``names`` (program names or paths) that can be run here, else None."""
    for name in names:
        if shutil.which(name):
            return name
    return None


def missing_binary(names: Sequence[str], hint: str) -> str:
    """Why a runtime cannot run: none of ``names`` is on PATH, and what to install."""
    return f"{' or '.join(names)} is not on PATH: {hint}"


def setpriv_argv(uid: int) -> list[str]:
    """util-linux ``setpriv``: run what follows as ``uid`` (and gid), with no groups."""
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]


class CappedOutput:
    """Keeps the first and last ``limit // 2`` bytes of a stream and counts the rest.

    A flood costs O(limit) memory however long it runs, and the agent still sees
    how the output began and how it ended (where errors usually are)."""

    def __init__(self, limit: int):
        self.limit = max(0, limit)
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        head_room = self.limit // 2 - len(self.head)
        if head_room > 0:
            self.head += data[:head_room]
            data = data[head_room:]
        if data:
            keep = self.limit - self.limit // 2
            self.tail += data
            if len(self.tail) > keep:
                del self.tail[: len(self.tail) - keep]

    @property
    def truncated(self) -> bool:
        return self.total > self.limit

    def text(self) -> str:
        if not self.truncated:
            return (bytes(self.head) + bytes(self.tail)).decode("utf-8", "replace")
        dropped = self.total - len(self.head) - len(self.tail)
        note = f"\n[... {dropped} bytes truncated ...]\n".encode()
        return (bytes(self.head) + note + bytes(self.tail)).decode("utf-8", "replace")


def exit_status(code: int | None, signal_codes: bool) -> tuple[int | None, int | None]:
    """(exit_code, signal) of a finished command. A negative returncode is a signal.
    With ``signal_codes`` an exit code 129..192 is read as a launcher's report of
    128 + signal (bwrap and shells exit so when their child is killed)."""
    if code is None:
        return None, None
    if code < 0:
        return None, -code
    if signal_codes and 128 < code <= 128 + 64:
        return None, code - 128
    return code, None


async def collect(
    process: HostProcess,
    timeout: float,
    stdin: bytes | None = None,
    max_output: int = 1 << 20,
    signal_codes: bool = False,
    started: float | None = None,
) -> ExecResult:
    """Drive a started pipe process (stderr separate) as a one-shot command.

    Nothing of it survives: when it exits (or at ``timeout``) its process group is
    killed, then the pipes are drained for at most ``DRAIN_GRACE`` seconds."""
    started = time.monotonic() if started is None else started
    out, err = CappedOutput(max_output), CappedOutput(max_output)

    async def pump(read: Callable[[int], Awaitable[bytes]], sink: CappedOutput) -> None:
        while chunk := await read(READ_CHUNK):
            sink.add(chunk)

    async def feed() -> None:
        try:
            if stdin:
                await process.write(stdin)
        except BrokenPipeError:
            pass  # the command exited without reading all of its input
        finally:
            process.close_stdin()

    pumps = [asyncio.ensure_future(pump(process.read, out)), asyncio.ensure_future(pump(process.read_stderr, err))]
    feeder = asyncio.ensure_future(feed())
    timed_out = False
    try:
        remaining = max(0.0, timeout - (time.monotonic() - started))
        code = await process.wait(remaining)
        if code is None:
            timed_out = True
            await process.kill(close=False)  # (on a normal exit its group was killed already)
        await asyncio.wait(pumps, timeout=DRAIN_GRACE)
    finally:
        process.kill_now()  # cancelled (or failed) half-way: nothing may survive
        for task in [*pumps, feeder]:
            task.cancel()
        await asyncio.gather(*pumps, feeder, return_exceptions=True)
        process.close()
    exit_code, signum = (None, None) if timed_out else exit_status(code, signal_codes)
    return ExecResult(
        exit_code=exit_code,
        stdout=out.text(),
        stderr=err.text(),
        timed_out=timed_out,
        truncated=out.truncated or err.truncated,
        seconds=time.monotonic() - started,
        signal=signum,
        cap=process.cap,
    )


async def run_command(
    argv: Sequence[str],
    timeout: float,
    stdin: bytes | None = None,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
    max_output: int = 1 << 20,
) -> ExecResult:
    """Run a host command to completion (or to ``timeout``, then kill its group)."""
    started = time.monotonic()
    process = HostProcess.start(argv, env=env, cwd=cwd, merge_stderr=False)
    return await collect(process, timeout, stdin, max_output, started=started)
