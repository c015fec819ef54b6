"""The sandbox contract: what every runtime does, run on every runtime in the registry
(each one that cannot run here is skipped with its reason)."""

from __future__ import annotations

import asyncio
import json
import time

import psutil
import pytest

from rollserve.sandbox.base import SandboxError, SandboxLimits, SandboxSpec
from tests.sandbox.helpers import (
    RUNTIMES,
    eventually,
    make_runtime,
    our_descendants,
    processes_with,
    wait_until,
)


@pytest.fixture(params=RUNTIMES)
def runtime(request, tmp_path):
    return make_runtime(request.param, tmp_path / "state")


@pytest.fixture
async def sandbox(runtime):
    box = await runtime.start(SandboxSpec(files={"task/README.md": "solve it\n"}, env={"TASK": "demo"}))
    yield box
    await box.close()


async def test_exec_returns_output_exit_code_and_env(sandbox):
    result = await sandbox.exec(
        "cat task/README.md; echo $TASK $EXTRA; echo warn >&2; exit 7", 10, env={"EXTRA": "more"}
    )
    assert result.exit_code == 7 and not result.ok
    assert result.stdout == "solve it\ndemo more\n" and result.stderr == "warn\n"
    assert (await sandbox.exec(["printf", "%s", "a b"], 10)).stdout == "a b"
    assert (await sandbox.exec("cat", 10, stdin=b"piped")).stdout == "piped"


async def test_server_environment_does_not_leak(sandbox, monkeypatch):
    monkeypatch.setenv("ROLLSERVE_API_TOKEN", "secret")
    result = await sandbox.exec("env", 10)
    assert "secret" not in result.stdout and "TASK=demo" in result.stdout


async def test_cwd_home_and_tmp_are_the_sandboxes(sandbox):
    result = await sandbox.exec('pwd; echo "$HOME"; echo "${TMPDIR:-/tmp}"; echo x > "${TMPDIR:-/tmp}/shared"', 10)
    cwd, home, tmp = result.stdout.split()
    assert cwd == "/workspace" or cwd == str(sandbox.workspace)
    # HOME is the private tmp, not the workspace: caches and dotfiles stay out of it.
    assert home == tmp and home in ("/tmp", str(sandbox.folders.tmp))
    # Every invocation of one sandbox sees the same tmp folder.
    assert (await sandbox.exec('cat "${TMPDIR:-/tmp}/shared"', 10)).stdout == "x\n"


async def test_files_written_by_the_server_are_the_sandboxes_and_back(sandbox):
    await sandbox.write_file("/workspace/src/main.py", "print('hi')\n")
    result = await sandbox.exec("python3 src/main.py && echo done >> src/main.py", 10)
    assert result.stdout == "hi\n"
    assert await sandbox.read_file("src/main.py") == b"print('hi')\ndone\n"
    with pytest.raises(PermissionError):
        await sandbox.write_file("../escape.txt", "x")
    with pytest.raises(PermissionError):
        await sandbox.read_file("/etc/passwd")


async def test_timeout_is_typed_and_kills_everything(sandbox):
    started = time.monotonic()
    result = await sandbox.exec("sleep 60 & sleep 60", 0.5)
    assert result.timed_out and result.exit_code is None and not result.ok
    assert time.monotonic() - started < 10  # bounded: far below the 60 s sleeps
    assert wait_until(lambda: not [p for p in our_descendants() if p.name() == "sleep"])


async def test_output_flood_is_truncated_head_and_tail(sandbox):
    result = await sandbox.exec("seq 1 200000; echo END", 10, max_output=2000)
    assert result.truncated and result.exit_code == 0
    assert result.stdout.startswith("1\n2\n3\n") and result.stdout.endswith("END\n")
    assert "bytes truncated" in result.stdout


async def test_spawn_pipes_interpreter_keeps_state(sandbox):
    process = await sandbox.spawn(["python3", "-u", "-i", "-q"], merge_stderr=False)
    await process.write(b"x = 20\nprint(x + 22)\n")
    out = b""
    while not out.endswith(b"\n"):  # read() returns whatever has arrived: maybe a part
        out += await asyncio.wait_for(process.read(), 10)
    assert out == b"42\n"
    await process.write(b"1/0\n")
    err = b""
    while b"ZeroDivisionError" not in err:
        err += await asyncio.wait_for(process.read_stderr(), 10)
    await process.kill()


async def test_pty_shell_interrupt_and_state(sandbox):
    shell = await sandbox.spawn(["bash", "--norc", "--noprofile", "-i"], pty=True, env={"PS1": "READY$ "})
    output = b""

    async def until(marker: bytes) -> None:
        nonlocal output
        while marker not in output:
            output += await asyncio.wait_for(shell.read(), 10)

    await until(b"READY$ ")
    await shell.write(b"cd task && export N=5\n")
    # The job says it has started once it is the terminal's foreground job (job control
    # hands it the terminal before its exec); a C-c before that would go to bash, which
    # drops it. (The PTY echoes the line: 'sta""rted' is not "started".)
    await shell.write(b"bash -c 'echo sta\"\"rted; exec sleep 30'\n")
    await until(b"started")
    await shell.write(b"\x03")  # SIGINT to the foreground job through the PTY
    await shell.write(b"echo rc=$? n=$N dir=${PWD##*/} tty=$(tty)\n")
    await until(b"rc=130 n=5 dir=task tty=/dev/")
    await shell.kill()


async def test_close_kills_every_process_and_removes_folders(runtime, tmp_path):
    box = await runtime.start(SandboxSpec())
    await box.spawn(["sleep", "infinity"])
    await box.spawn(["bash", "-i"], pty=True)
    await box.spawn(["bash", "-c", "sleep 1000 & sleep 1000 & wait"])
    record = tmp_path / "state" / "sandboxes" / f"{box.id}.json"
    assert len(json.loads(record.read_text())["processes"]) >= 3
    before = {p.pid for p in our_descendants()}
    assert before
    await box.close()
    await box.close()  # idempotent
    assert wait_until(lambda: not [p for p in our_descendants() if p.status() != psutil.STATUS_ZOMBIE])
    assert not box.workspace.exists() and not record.exists()
    with pytest.raises(SandboxError):
        await box.exec("true", 5)


async def test_cancelled_exec_leaves_nothing_running(sandbox):
    task = asyncio.ensure_future(sandbox.exec("sleep 60", 30))
    await eventually(lambda: processes_with("sleep 60"), what="the exec's `sleep 60`")
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert await eventually(lambda: not [p for p in our_descendants() if p.name() == "sleep"])


async def test_limits_file_size_and_cpu(runtime):
    limits = SandboxLimits(file_size_mb=1, cpu_seconds=1)
    async with await runtime.start(SandboxSpec(limits=limits)) as box:
        big = await box.exec("head -c 3000000 /dev/zero > big", 10)
        assert not big.ok and big.signal == 25  # SIGXFSZ
        spin = await box.exec("while :; do :; done", 10)
        assert spin.signal in (9, 24) and not spin.timed_out  # SIGXCPU, then SIGKILL
        assert spin.seconds < 15  # 1 s of CPU; wall time depends on the host's load


async def test_many_concurrent_execs_do_not_block_the_loop(sandbox, loop_gaps):
    results = await asyncio.gather(*(sandbox.exec(f"echo {i}", 20) for i in range(20)))
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(20)]
    assert max(loop_gaps, default=0) < 0.5
