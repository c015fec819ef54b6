"""Commands a test needs the result of, started when the test session starts.

A test whose work is one long subprocess that needs nothing from the other tests (mypy
over src/: 60-120 s cold on a 2-core machine) starts it here, as soon as pytest has
collected the session and the test is among the selected ones, so it runs while the
other tests wait on their servers and sandboxes; the test then only collects its
result, under the same time bound it always had (counted from the command's start).
A command is started at most once; whatever still runs when the session ends is killed.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Started:
    args: list[str]
    proc: subprocess.Popen[bytes]
    out: IO[bytes]  # stdout and stderr, in a temporary file (a pipe could fill and block it)
    began: float

    def result(self, timeout: float) -> subprocess.CompletedProcess[str]:
        """Wait at most ``timeout`` s from the start; raises subprocess.TimeoutExpired
        (the command killed) past it."""
        try:
            self.proc.wait(max(0.0, self.began + timeout - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.stop()
            raise subprocess.TimeoutExpired(self.args, timeout, output=self._output()) from None
        return subprocess.CompletedProcess(self.args, self.proc.returncode, self._output(), "")

    def _output(self) -> str:
        self.out.seek(0)
        return self.out.read().decode(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


# nodeid of the test -> the command it needs (``python -m ...`` in the repository root)
COMMANDS: dict[str, list[str]] = {
    "tests/test_tooling.py::test_mypy_reports_nothing_on_src": ["mypy"],
}
_started: dict[str, Started] = {}


def start_for(nodeids: Iterable[str]) -> None:
    """Start the command of each selected test that has one."""
    for nodeid in set(nodeids) & COMMANDS.keys():
        if nodeid not in _started:
            args = [sys.executable, "-m", *COMMANDS[nodeid]]
            out = tempfile.TemporaryFile()
            proc = subprocess.Popen(args, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            _started[nodeid] = Started(args, proc, out, time.monotonic())


def started(nodeid: str) -> Started | None:
    """The command started early for this test, or None (not selected through the
    session's collection, e.g. the test function called some other way)."""
    return _started.get(nodeid)


def pids() -> set[int]:
    """The processes started here (running or exited and not yet reaped): the session's
    own, not any test's (tests/sandbox/helpers.py's ``our_descendants`` leaves them out)."""
    return {entry.proc.pid for entry in _started.values()}


def stop_all() -> None:
    for entry in _started.values():
        entry.stop()
        entry.out.close()
    _started.clear()
