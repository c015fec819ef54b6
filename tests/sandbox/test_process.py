"""HostProcess and the one-shot helpers, on plain host commands."""

from __future__ import annotations

import asyncio
import signal
import time

import psutil

from rollserve.sandbox.host import CappedOutput, exit_status, run_command
from rollserve.sandbox.process import HostProcess
from tests.sandbox.helpers import eventually, our_descendants, processes_with


def test_capped_output_keeps_head_and_tail():
    out = CappedOutput(10)
    for chunk in (b"abc", b"defgh", b"ijklmnop", b"qrstuvwxyz"):
        out.add(chunk)
    assert out.truncated and out.total == 26
    assert out.text().startswith("abcde") and out.text().endswith("vwxyz")
    assert "16 bytes truncated" in out.text()
    small = CappedOutput(10)
    small.add(b"0123456789")
    assert not small.truncated and small.text() == "0123456789"


def test_exit_status_reads_signals():
    assert exit_status(0, False) == (0, None)
    assert exit_status(-9, False) == (None, 9)
    assert exit_status(137, True) == (None, 9)
    assert exit_status(137, False) == (137, None)
    assert exit_status(None, True) == (None, None)


async def test_run_command_output_exit_code_and_stdin():
    result = await run_command(["bash", "-c", "cat; echo oops >&2; exit 3"], 5, stdin=b"in")
    assert (result.exit_code, result.stdout, result.stderr) == (3, "in", "oops\n")
    assert not result.timed_out and not result.ok


async def test_run_command_timeout_kills_the_whole_group():
    started = time.monotonic()
    result = await run_command(["bash", "-c", "sleep 60 & sleep 60; echo never"], 0.3)
    assert result.timed_out and result.exit_code is None and not result.ok
    assert time.monotonic() - started < 10  # bounded: far below the 60 s sleeps
    assert not [p for p in our_descendants() if "sleep" in p.name()]


async def test_background_process_does_not_hold_a_one_shot_command():
    started = time.monotonic()
    result = await run_command(["bash", "-c", "sleep 60 & echo done"], 10)
    assert result.stdout == "done\n" and time.monotonic() - started < 8  # not the 60 s sleep


async def test_flood_is_truncated_not_buffered():
    result = await run_command(["bash", "-c", "head -c 5000000 /dev/zero | tr '\\0' x; echo END"], 10, max_output=1000)
    assert result.truncated and result.exit_code == 0
    assert result.stdout.startswith("x" * 500) and result.stdout.endswith("END\n")
    assert len(result.stdout) < 1100


async def test_read_returns_as_soon_as_bytes_arrive():
    process = HostProcess.start(["bash", "-c", "echo first; sleep 5; echo second"])
    started = time.monotonic()
    assert await process.read() == b"first\n"
    assert time.monotonic() - started < 4  # before the 5 s sleep ends
    await process.kill()
    assert await process.read() == b""  # closed: end of output, not a hang


async def test_pty_process_has_job_control():
    # setsid --ctty: its own session, the PTY as controlling terminal.
    process = HostProcess.start(
        ["setsid", "--ctty", "--wait", "bash", "--norc", "-i"],
        pty=True,
        new_session=False,
        env={"PATH": "/usr/bin:/bin", "PS1": "$ "},
    )
    await process.write(b"sleep 30\n")
    assert await eventually(lambda: processes_with("sleep 30"), timeout=30)
    await process.write(b"\x03")  # SIGINT to the foreground job (sleep), not to bash
    await process.write(b"echo rc=$?\n")
    output = b""
    while b"rc=130" not in output:
        output += await asyncio.wait_for(process.read(), 5)
    try:
        await process.write(b"exit 4\n")
        assert await process.wait(5) == 4
    finally:
        await process.kill()


async def test_pipes_separate_stderr_and_signal():
    process = HostProcess.start(["bash", "-c", "echo err >&2; exec sleep 30"], merge_stderr=False)
    assert await asyncio.wait_for(process.read_stderr(), 5) == b"err\n"
    process.signal(signal.SIGTERM)
    assert await process.wait(5) == -signal.SIGTERM
    await process.kill()  # idempotent after exit
    await process.kill()


async def test_wait_is_bounded():
    process = HostProcess.start(["sleep", "30"])
    assert await process.wait(0.1) is None
    await process.kill()
    assert process.returncode == -signal.SIGKILL


async def test_cancelled_collect_kills_the_process():
    task = asyncio.ensure_future(run_command(["sleep", "60"], 30))
    assert await eventually(lambda: processes_with("sleep 60"), timeout=30)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert await eventually(lambda: not [p for p in our_descendants() if p.status() != psutil.STATUS_ZOMBIE])


async def test_signal_foreground_reaches_the_foreground_job_not_the_shell():
    shell = HostProcess.start(["setsid", "--ctty", "--wait", "bash", "--norc", "-i"], pty=True, new_session=False)
    try:
        await shell.write(b"stty -echo; echo rea''dy\n")  # (its echo is not "ready")
        seen = b""
        while b"ready" not in seen:
            seen += await asyncio.wait_for(shell.read(), 5)
        assert shell.signal_foreground(signal.SIGKILL) is False  # only the shell: left alone
        await shell.write(b"sleep 31.5; echo after=$?\n")
        # Once `sleep` runs, its job has the terminal (the child takes it before its exec;
        # a kill while bash still sets the job up can leave bash without it)
        await eventually(
            lambda: processes_with("sleep 31.5") and shell.signal_foreground(signal.SIGKILL),
            what="sleep to be the terminal's foreground job (and signalled)",
        )
        seen = b""
        while b"after=137" not in seen:
            seen += await asyncio.wait_for(shell.read(), 5)
        assert shell.returncode is None  # the shell survived
    finally:
        shell.kill_now()
        await shell.kill()
    pipes = HostProcess.start(["sleep", "30"])
    assert pipes.signal_foreground(signal.SIGKILL) is False  # no terminal
    pipes.kill_now()
    assert await pipes.wait(5) == -signal.SIGKILL


def test_exec_result_says_why_it_failed():
    from rollserve.sandbox.base import ExecResult

    assert ExecResult(None, "partial", "", timed_out=True).failure() == "timed out"
    assert ExecResult(1, "out", "x" * 600 + "the error\n").failure(20) == "x" * 11 + "the error"
    assert ExecResult(2, "only stdout\n", "").failure() == "only stdout"
    assert ExecResult(3, "", "").failure() == "exit 3"
    assert ExecResult(None, "", "", signal=9).failure() == "killed by signal 9"
