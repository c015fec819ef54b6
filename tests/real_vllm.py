"""Where the tests marked ``vllm`` find their real vLLM server.

``ROLLSERVE_VLLM_URL`` (and ``ROLLSERVE_VLLM_LORA_URL``, for the tests that load LoRA
adapters) name a running server, used as they are. Without them the tests skip, saying
so, unless ``ROLLSERVE_VLLM_URL_FILE`` names a file that a server being started right
now will write: CI (``.ci/run``) starts ``scripts/vllm_cpu/start.sh`` in the background
and runs the tests meanwhile. Then the tests that need the server run last
(tests/conftest.py orders them), and before the first of them pytest waits, at most
``ROLLSERVE_VLLM_URL_WAIT`` seconds (default 900), for that file. Its lines are
``NAME=value``: ``ROLLSERVE_VLLM_URL=...`` and ``ROLLSERVE_VLLM_LORA_URL=...`` when
the server is up, ``error=<why>`` when starting it failed.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

URL_VARS = ("ROLLSERVE_VLLM_URL", "ROLLSERVE_VLLM_LORA_URL")
FILE_VAR = "ROLLSERVE_VLLM_URL_FILE"
WAIT_VAR = "ROLLSERVE_VLLM_URL_WAIT"
DEFAULT_WAIT = 900.0  # s; the rest of the suite runs first (about 20 min in CI)
FIXTURES = ("vllm_url", "vllm_lora_url")  # the tests that need the server ask for these


@dataclass
class Pending:
    """A server being started by someone else, announced through a file."""

    path: Path
    wait: float
    done: bool = False
    error: str | None = None
    found: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_env(cls) -> Pending | None:
        """The announced server, if the URL is not given and a file is named."""
        name = os.environ.get(FILE_VAR, "").strip()
        if not name or os.environ.get("ROLLSERVE_VLLM_URL"):
            return None
        raw = os.environ.get(WAIT_VAR, "").strip()
        try:
            wait = float(raw) if raw else DEFAULT_WAIT
        except ValueError:
            wait = DEFAULT_WAIT
        return cls(Path(name), wait)

    def wait_for_it(self) -> None:
        """Wait (once, bounded) for the file; put the URLs it gives into the
        environment, or keep why there is no server."""
        if self.done:
            return
        self.done = True
        deadline = time.monotonic() + self.wait
        while not self.path.exists():
            if time.monotonic() >= deadline:
                self.error = (
                    f"the vLLM server being started for this run did not come up "
                    f"within {self.wait:g} s of waiting ({self.path} was never written)"
                )
                return
            time.sleep(1.0)
        for line in self.path.read_text(encoding="utf-8", errors="replace").splitlines():
            name, sep, value = line.partition("=")
            if not sep:
                continue
            if name == "error":
                self.error = value.strip() or "starting the vLLM server failed"
            elif name in URL_VARS and value.strip():
                self.found[name] = value.strip()
        if self.error is None and "ROLLSERVE_VLLM_URL" not in self.found:
            self.error = f"{self.path} names no ROLLSERVE_VLLM_URL"
        if self.error is None:
            os.environ.update(self.found)


def skip_reason(var: str, pending: Pending | None) -> str | None:
    """Why a test needing ``var`` cannot run (None: it can)."""
    if os.environ.get(var):
        return None
    if pending is not None and pending.error is not None:
        return f"no real vLLM server: {pending.error} (see the vLLM start-up log CI prints)"
    if var == "ROLLSERVE_VLLM_LORA_URL":
        return (
            "set ROLLSERVE_VLLM_LORA_URL to a vLLM server with SmolLM2 and runtime LoRA "
            "(start.sh, ROLLSERVE_VLLM_LORA=1)"
        )
    return "set ROLLSERVE_VLLM_URL to a vLLM server with SmolLM2 (scripts/vllm_cpu/start.sh)"
