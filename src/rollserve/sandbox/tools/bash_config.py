"""The bash tool's settings and what a call returns (the session is in bash.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_ENV = {
    "TERM": "dumb",  # no colours, no cursor games: the model reads plain text
    "PAGER": "cat",
    "GIT_PAGER": "cat",
    "MANPAGER": "cat",
    "SYSTEMD_PAGER": "",
    "NO_COLOR": "1",
    "PIP_PROGRESS_BAR": "off",
    "PYTHONUNBUFFERED": "1",
    "DEBIAN_FRONTEND": "noninteractive",
    "GIT_TERMINAL_PROMPT": "0",
}


class BashConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    timeout: float = Field(120.0, gt=0, description="hard limit per command (s), then interrupted")
    idle_timeout: float | None = Field(30.0, gt=0, description="no output for this long (s): interrupted; None: off")
    idle_action: Literal["interrupt", "return"] = Field(
        "interrupt",
        description="at the idle timeout: stop the command, or return with it still running "
        "(a program waiting for input can then be answered with send)",
    )
    input_wait: float | None = Field(
        1.0,
        gt=0,
        description="silent this long (s), the command is checked for waiting on terminal "
        "input (a prompt, `read`, `input()`); if it is, the call returns with it running, to "
        "be answered with send. None: off (only `expect` or the idle action return early)",
    )
    send_timeout: float = Field(5.0, gt=0, description="send(): how long to wait for output (s)")
    interrupt_grace: float = Field(2.0, gt=0, description="seconds per escalation step")
    start_timeout: float = Field(20.0, gt=0)
    max_output_bytes: int = Field(30_000, ge=256, description="kept per call, head + tail")
    flood_bytes: int = Field(64 << 20, ge=1024, description="more output than this: interrupted")
    shell: list[str] = Field(default_factory=lambda: ["bash", "--norc", "--noprofile", "--noediting", "-i"])
    env: dict[str, str] = Field(default_factory=lambda: dict(DEFAULT_ENV))
    cwd: str | None = Field(None, description="start here (None: where the runtime starts, the workspace)")


@dataclass
class BashResult:
    output: str  # ANSI and \r noise stripped, head + tail if truncated
    exit_code: int | None  # None: still running, or the shell died / was replaced
    seconds: float
    timed_out: bool = False  # hard or idle timeout hit
    interrupted: bool = False  # we stopped the command (timeout or flood)
    truncated: bool = False
    dropped_bytes: int = 0
    running: bool = False  # returned before the command ended (expect, input wait, send)
    waiting_for_input: bool = False  # returned because it waits for terminal input
    shell_restarted: bool = False  # the shell was replaced: cwd, env and jobs are reset
    notes: list[str] = field(default_factory=list)

    def to_text(self) -> str:
        """What the model reads: the output, then a line per fact worth knowing."""
        lines = [self.output.rstrip("\n")] if self.output.strip() else []
        lines += [f"[{note}]" for note in self.notes]
        if self.exit_code is not None and not self.running:
            lines.append(f"[exit code: {self.exit_code}]")
        return "\n".join(lines) if lines else "[no output]"


class BashBusy(RuntimeError):
    """``run`` while an earlier command still runs (it returned early, still running)."""
