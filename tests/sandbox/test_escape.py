"""The escape suite: what an agent must not be able to do from a bubblewrap sandbox.

Runs as whoever runs pytest. When that is root, the last test re-runs this whole
module as an unprivileged uid (65534, "nobody", through util-linux ``setpriv``, no
user account created), so both ways the server may run are covered: root (sandboxes
get a uid of their own) and a plain user (sandboxes in a user namespace of its uid).
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import time
import uuid
from pathlib import Path

import psutil
import pytest

import rollserve
from rollserve.sandbox.base import SandboxLimits, SandboxSpec
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from tests.sandbox.helpers import NESTED, REPO, our_descendants, rerun_unprivileged, wait_until

pytestmark = pytest.mark.skipif(
    BubblewrapRuntime.unavailable_reason() is not None, reason=f"{BubblewrapRuntime.unavailable_reason()}"
)


@pytest.fixture
async def box(tmp_path):
    runtime = BubblewrapRuntime(state_dir=tmp_path / "state")
    sandbox = await runtime.start(SandboxSpec(limits=SandboxLimits(memory_mb=512, pids=64)))
    yield sandbox
    await sandbox.close()


@pytest.fixture
def listener():
    """A TCP port listening on the host's 127.0.0.1; records whether anyone connected."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.setblocking(False)
    yield server
    server.close()


def connected(server: socket.socket) -> bool:
    try:
        server.accept()[0].close()
        return True
    except BlockingIOError:
        return False


CONNECT = (
    "import socket, sys\n"
    "try:\n socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=3)\n"
    "except OSError as e:\n print(type(e).__name__); sys.exit(1)\nprint('connected')\n"
)


async def test_no_network_to_host_loopback(box, listener):
    port = str(listener.getsockname()[1])
    result = await box.exec(["python3", "-c", CONNECT, port], 10)
    assert result.exit_code == 1 and "connected" not in result.stdout
    assert not connected(listener)
    outside = await box.exec("getent hosts pypi.org || echo no-dns", 10)
    assert "no-dns" in outside.stdout


async def test_network_when_the_spec_asks_for_it(tmp_path, listener):
    # The control for the test above: the same connect works with network on.
    runtime = BubblewrapRuntime(state_dir=tmp_path / "state")
    async with await runtime.start(SandboxSpec(network=True)) as sandbox:
        result = await sandbox.exec(["python3", "-c", CONNECT, str(listener.getsockname()[1])], 10)
    assert result.stdout == "connected\n"
    assert wait_until(lambda: connected(listener), timeout=2)


def visible(path: Path) -> bool:
    try:
        return path.exists()
    except PermissionError:  # (unprivileged run: /root is closed to us, and to it)
        return False


async def test_no_writes_outside_the_workspace(box):
    name = f"rollserve-escape-{uuid.uuid4().hex[:8]}"
    targets = ["/etc", "/root", "/home", "/usr", "/var/tmp", str(REPO), str(box.folders.base)]
    script = "; ".join(f"touch {t}/{name} 2>/dev/null && echo WROTE {t}" for t in targets)
    result = await box.exec(script + f"; touch /workspace/{name} /tmp/{name} && echo inside", 10)
    # A target under /tmp (a checkout there) is, inside, a folder of the sandbox's own
    # private /tmp: writing there reaches no host file, which the loop below proves.
    for target in targets:
        if Path("/tmp") not in Path(target).parents:
            assert f"WROTE {target}\n" not in result.stdout + "\n"
    assert "inside" in result.stdout
    for target in targets:
        assert not visible(Path(target, name))
    assert (box.workspace / name).exists() and (box.folders.tmp / name).exists()
    assert not visible(Path("/tmp", name))  # the sandbox's /tmp is not the host's


async def test_host_processes_are_invisible(box):
    marker = f"{time.time() % 1000 + 1000:.3f}"  # a unique sleep duration to look for
    host_sleep = subprocess.Popen(["sleep", marker])
    try:
        result = await box.exec("ps -eo pid,args; ls /proc | grep -c '^[0-9]'", 10)
    finally:
        host_sleep.kill()
        host_sleep.wait()
    lines = result.stdout.splitlines()
    assert marker not in result.stdout
    assert int(lines[-1]) <= 4  # bwrap's init, bash, ps, ls (+ grep)
    assert lines[1].split(None, 1)[0] == "1" and "bwrap" in lines[1]


async def test_hidden_folders_are_empty(box):
    """Empty but for the read-only paths bound back (the server's Python, when it
    lives under one of them and the sandbox's user can reach it)."""
    hidden = [Path("/root"), Path("/home"), Path("/run")]
    expected = {
        str(h / Path(p).relative_to(h).parts[0])
        for p in box._owner.readonly_paths()
        for h in hidden
        if h in Path(p).parents
    }
    result = await box.exec("find /root /home /run -mindepth 1 -maxdepth 1", 10)
    assert set(result.stdout.split()) == expected


async def test_the_bundled_datasets_and_their_answers_are_hidden(box):
    """The host root is shown read-only, and with it rollserve's own package: its
    bundled datasets hold the gold answers (math_tasks.jsonl: question and answer)."""
    data = Path(rollserve.__file__).resolve().parent / "data"
    assert (data / "math_tasks.jsonl").is_file()
    result = await box.exec(f"ls -A {data}; cat {data}/math_tasks.jsonl", 10)
    assert result.stdout == "" and "No such file" in result.stderr, result


async def test_fork_bomb_is_contained_and_reported(box):
    bomb = "bomb() { bomb | bomb & }; bomb; for i in $(seq 300); do sleep 30 & done; wait"
    task = asyncio.ensure_future(box.exec(bomb, timeout=3, max_output=4096))
    peak, host_spawn = 0, []
    while not task.done():
        peak = max(peak, len(our_descendants()))
        started = time.monotonic()
        subprocess.run(["true"], check=True)  # the host can still start processes
        host_spawn.append(time.monotonic() - started)
        await asyncio.sleep(0.1)  # sleep-ok: the pace of sampling while the bomb runs
    result = await task
    assert result.timed_out or result.exit_code != 0
    assert "Resource temporarily unavailable" in result.stdout + result.stderr
    assert result.seconds < 8
    assert peak <= 64 + 3  # the pids limit, plus the launcher outside the sandbox
    assert max(host_spawn) < 3.0  # the host is not starved (a loaded CI host needs slack)
    assert wait_until(lambda: not our_descendants(), timeout=5)
    assert (await box.exec("echo still usable", 10)).stdout == "still usable\n"


async def test_memory_hog_is_contained_and_reported(box):
    started = time.monotonic()
    result = await box.exec(["python3", "-c", "x = bytearray(2 << 30)"], 20)
    assert not result.ok and not result.timed_out
    assert "MemoryError" in result.stderr or result.signal == 9  # rlimit, or a cgroup
    assert time.monotonic() - started < 10
    assert psutil.virtual_memory().available > 256 << 20


async def test_sleep_infinity_is_killed_at_the_timeout(box):
    result = await box.exec("sleep infinity", 1.0)
    assert result.timed_out and result.exit_code is None and 0.9 < result.seconds < 6
    assert wait_until(lambda: not our_descendants(), timeout=5)


async def test_output_flood_is_truncated(box):
    result = await box.exec("yes flood", 1.0, max_output=10_000)
    assert result.timed_out and result.truncated
    assert result.stdout.startswith("flood\n") and len(result.stdout) < 10_100
    assert wait_until(lambda: not our_descendants(), timeout=5)


async def test_setuid_and_privilege_are_gone(box):
    result = await box.exec("grep -E '^(Cap(Eff|Prm)|NoNewPrivs)' /proc/self/status; id -u", 10)
    assert "CapEff:\t0000000000000000" in result.stdout
    assert result.stdout.split()[-1] != "0" or os.geteuid() != 0  # root server: not uid 0


@pytest.mark.skipif(os.geteuid() != 0, reason="already unprivileged: this run is that case")
@pytest.mark.skipif(os.environ.get(NESTED) == "1", reason="nested run")
def test_escape_suite_as_an_unprivileged_user(tmp_path):
    rerun_unprivileged(__file__, tmp_path)
