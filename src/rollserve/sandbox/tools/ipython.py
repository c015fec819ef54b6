"""A persistent IPython kernel inside a sandbox, spoken to over the sandbox's stdio.

No network, no TCP, no Jupyter: the host starts ``ipython_driver`` with the
sandbox's python on pipes and exchanges JSON lines with it (see that module for the
wire). Cells are stateful across calls; stdout/stderr (including subprocesses'),
the result's repr, tracebacks as plain text and images (matplotlib figures, PIL
images, anything with ``_repr_png_``) as base64 PNG come back per cell.

Timeouts keep the kernel: at a cell's timeout the host asks the driver to interrupt
it (SIGINT inside the sandbox: KeyboardInterrupt in the cell, variables kept). A cell
that does not come back within the grace (stuck in C code that ignores signals)
loses the kernel: it is killed, the result says so, and the next cell starts a fresh
one.

The sandbox's python must have IPython. On ``bubblewrap`` over the host root,
``find_python`` picks the sandboxes' own Python (``sandbox/sandbox_python.py``: IPython
and a few packages copied from this server's, never its site-packages), on ``local``
this server's own interpreter. For an image (docker/podman, apptainer .sif,
a bubblewrap rootfs) set ``python`` to an interpreter in the image that has
``ipython`` (and ``matplotlib`` for plots) installed.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from rollserve.sandbox.base import Sandbox, SandboxError, SandboxProcess
from rollserve.sandbox.tools.text import clean_terminal_text

DRIVER_SOURCE = (Path(__file__).with_name("ipython_driver.py")).read_text(encoding="utf-8")


class IPythonConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    python: str | None = Field(
        None,
        description="the interpreter inside the sandbox (it needs ipython); None: found by "
        "handlers.sandboxed.find_python (the sandboxes' own Python), else python3",
    )
    timeout: float = Field(30.0, gt=0, description="seconds per cell, then interrupted")
    interrupt_grace: float = Field(3.0, gt=0, description="after an interrupt, wait this long")
    start_timeout: float = Field(60.0, gt=0)
    max_output_bytes: int = Field(20_000, ge=256, description="per stream, head + tail")
    max_images: int = Field(4, ge=0)
    env: dict[str, str] = Field(
        default_factory=lambda: {
            # Figures go to the inline backend: shown as PNG after the cell, no GUI.
            "MPLBACKEND": "module://matplotlib_inline.backend_inline",
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
    )


@dataclass
class CellResult:
    stdout: str = ""
    stderr: str = ""
    result: str | None = None  # repr of the cell's last expression
    error: str | None = None  # traceback text, ANSI stripped
    error_name: str | None = None
    images: list[str] = field(default_factory=list)  # base64 PNG
    display: list[str] = field(default_factory=list)  # text of display() calls
    execution_count: int | None = None
    timed_out: bool = False
    kernel_lost: bool = False  # the kernel died or was killed: its state is gone
    truncated: bool = False
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None and not self.timed_out and not self.kernel_lost

    def to_text(self) -> str:
        """What the model reads (images are counted here; callers send them apart)."""
        parts = [p.rstrip("\n") for p in (self.stdout, self.stderr) if p.strip()]
        parts += [d for d in self.display if d.strip()]
        if self.result is not None:
            parts.append(f"Out[{self.execution_count}]: {self.result}" if self.execution_count else self.result)
        if self.error:
            parts.append(self.error.rstrip("\n"))
        if self.images:
            parts.append(f"[{len(self.images)} image(s) returned as PNG]")
        parts += [f"[{note}]" for note in self.notes]
        return "\n".join(parts) if parts else "[no output]"


class IPythonSession:
    """One kernel in one sandbox. ``run`` a cell; state persists between cells."""

    def __init__(self, sandbox: Sandbox, config: IPythonConfig | None = None):
        self.sandbox = sandbox
        self.config = config or IPythonConfig()
        self.process: SandboxProcess | None = None
        self._tag = f"\x1e{secrets.token_hex(6)}:".encode()
        self._buffer = bytearray()
        self._log = bytearray()  # the driver's non-protocol output, for error messages
        self._next_id = 0
        self._kernels = 0
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        argv = [
            self.config.python or "python3",
            "-u",
            "-c",
            DRIVER_SOURCE,
            self._tag.decode(),
            str(self.config.max_output_bytes),
            str(self.config.max_images),
        ]
        self.process = await self.sandbox.spawn(argv, pty=False, env=dict(self.config.env))
        self._buffer.clear()
        self._log.clear()
        self._kernels += 1
        try:
            async with asyncio.timeout(self.config.start_timeout):
                ready = await self._next_message()
        except TimeoutError:
            ready = None
        if not ready or not ready.get("ready"):
            log = self._log_tail()
            await self._kill()
            raise SandboxError(f"the IPython kernel did not start with {self.config.python}: {log}")

    async def close(self) -> None:
        await self._kill()

    async def __aenter__(self) -> IPythonSession:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def run(self, code: str, timeout: float | None = None) -> CellResult:
        async with self._lock:
            started = time.perf_counter()
            notes = []
            if self.process is None:
                if self._kernels:
                    notes.append("a new kernel was started: variables from earlier cells are gone")
                await self.start()
            self._next_id += 1
            cell_id = self._next_id
            try:
                await self._send({"op": "run", "id": cell_id, "code": code})
                result = await self._await_cell(cell_id, timeout or self.config.timeout)
            except BaseException:
                await self._kill()  # cancelled or broken mid-cell: never reuse a kernel in an unknown state
                raise
            result.notes[:0] = notes
            result.seconds = time.perf_counter() - started
            return result

    # --- internals ---------------------------------------------------------------------
    async def _await_cell(self, cell_id: int, limit: float) -> CellResult:
        try:
            async with asyncio.timeout(limit):
                return self._cell_result(await self._response(cell_id))
        except TimeoutError:
            pass
        except (EOFError, BrokenPipeError, ConnectionError):
            return await self._lost(f"the kernel died during the cell: {self._log_tail()}", False)
        # Interrupt inside the sandbox; the kernel and its variables stay.
        try:
            await self._send({"op": "interrupt", "id": cell_id})
            async with asyncio.timeout(self.config.interrupt_grace):
                result = self._cell_result(await self._response(cell_id))
            result.timed_out = True
            result.notes.append(
                f"the cell did not finish within {limit:g} s and was interrupted "
                "(KeyboardInterrupt); the kernel and its variables are kept"
            )
            return result
        except (TimeoutError, EOFError, BrokenPipeError, ConnectionError):
            return await self._lost(
                f"the cell did not finish within {limit:g} s and did not stop when interrupted; "
                "the kernel was restarted and its variables are gone",
                True,
            )

    async def _lost(self, note: str, timed_out: bool) -> CellResult:
        await self._kill()
        return CellResult(kernel_lost=True, timed_out=timed_out, notes=[note])

    def _cell_result(self, message: dict) -> CellResult:
        error = message.get("error")
        return CellResult(
            stdout=clean_terminal_text(message.get("stdout") or ""),
            stderr=clean_terminal_text(message.get("stderr") or ""),
            result=message.get("result"),
            error=clean_terminal_text(error) if error else None,
            error_name=message.get("error_name"),
            images=list(message.get("images") or []),
            display=[clean_terminal_text(t) for t in message.get("display") or []],
            execution_count=message.get("count"),
            truncated=bool(message.get("dropped")),
            notes=[f"{message['images_dropped']} more image(s) not returned"] if message.get("images_dropped") else [],
        )

    async def _response(self, cell_id: int) -> dict:
        while True:
            message = await self._next_message()
            if message is None:
                raise EOFError("kernel output ended")
            if message.get("id") == cell_id:
                return message
            # A response to an older, abandoned cell: skip it.

    async def _next_message(self) -> dict | None:
        """The next protocol message; None at end of output."""
        while True:
            newline = self._buffer.find(b"\n")
            while newline >= 0:
                line = bytes(self._buffer[:newline])
                del self._buffer[: newline + 1]
                start = line.find(self._tag)
                if start >= 0:
                    self._note_log(line[:start])
                    try:
                        return json.loads(line[start + len(self._tag) :])
                    except ValueError:
                        self._note_log(line)
                else:
                    self._note_log(line + b"\n")
                newline = self._buffer.find(b"\n")
            if self.process is None:
                return None
            chunk = await self.process.read(1 << 20)
            if not chunk:
                self._note_log(bytes(self._buffer))
                return None
            self._buffer += chunk

    async def _send(self, message: dict) -> None:
        if self.process is None:
            raise BrokenPipeError("no kernel")
        await self.process.write((json.dumps(message) + "\n").encode())

    def _note_log(self, data: bytes) -> None:
        self._log += data
        del self._log[:-4096]

    def _log_tail(self) -> str:
        text = clean_terminal_text(self._log.decode("utf-8", "replace")).strip()
        return text[-1500:] or "(no output)"

    async def _kill(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            try:
                await process.kill()
            except Exception:
                pass
