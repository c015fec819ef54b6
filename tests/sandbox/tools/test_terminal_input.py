"""The kernel's answer to "is the foreground job reading its terminal?", on real
processes with a real PTY as their controlling terminal, and the fallback sign."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from rollserve.sandbox.tools.terminal_input import TerminalProbe, looks_like_a_prompt
from tests.sandbox.helpers import wait_until

pytestmark = pytest.mark.skipif(
    platform.machine() not in ("x86_64", "aarch64"), reason="system call numbers known for x86-64 and arm64 only"
)


def on_a_terminal(code: str) -> tuple[subprocess.Popen, int]:
    """``python -c code`` as the session leader of a new PTY (setsid --ctty execs in
    place: the pid is the program's)."""
    master, slave = os.openpty()
    process = subprocess.Popen(
        ["setsid", "--ctty", sys.executable, "-c", code], stdin=slave, stdout=slave, stderr=slave
    )
    os.close(slave)
    return process, master


@pytest.mark.parametrize(
    "code, expected",
    [
        ("print('ready', flush=True); input('name? ')", True),
        ("import sys; print('ready', flush=True); sys.stdin.read()", True),
        ("import time; print('ready', flush=True); time.sleep(60)", False),
        ("print('ready', flush=True)\nwhile True: pass", False),
    ],
)
def test_the_kernel_tells_a_reader_from_a_sleeper(code, expected):
    process, master = on_a_terminal(code)
    try:
        assert b"ready" in os.read(master, 100)
        probe = TerminalProbe(process.pid, process.pid)
        assert probe.host_pid() == process.pid
        # The reader reaches its read() a moment after printing.
        assert wait_until(lambda: probe.waiting_for_input() is expected, timeout=10)
    finally:
        process.kill()
        process.wait(10)
        os.close(master)


def test_a_shell_the_runtime_does_not_show_cannot_be_asked():
    # A launcher whose descendants hold no process of that pid (a container engine's
    # client): the probe says it cannot tell, never "not reading".
    probe = TerminalProbe(os.getpid(), 2**22 + 7)
    assert probe.host_pid() is None and probe.waiting_for_input() is None


def test_the_fallback_sign_is_a_line_left_open():
    assert looks_like_a_prompt("Continue? [Y/n] ")
    assert looks_like_a_prompt("installing...\n>>> ")
    assert not looks_like_a_prompt("done\n")
    assert not looks_like_a_prompt("")
    assert not looks_like_a_prompt("   ")
