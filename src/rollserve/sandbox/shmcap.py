"""Shared memory that RLIMIT_AS does not see, capped per bubblewrap sandbox when no
cgroup bounds its memory (with one, the kernel charges all of it to the cgroup).

RLIMIT_AS bounds what each process maps. Three kinds of memory outlive a mapping:

- POSIX shared memory: files in /dev/shm, a tmpfs of ``tmpfs_mb`` per command
  (bwrap_view.py): the filesystem's size is the cap.
- System V shared memory: a segment lives on in its IPC namespace after every
  process detached it. Each command is its own bwrap with its own IPC namespace,
  whose ``kernel.shm*`` sysctls belong to that namespace: in the window where bwrap
  waits (``--block-fd``), the server enters the namespace (``nsenter``, as whoever
  owns those sysctls there: host root, or the sandbox's uid once bwrap mapped it)
  and sets ``shmall`` / ``shmmax`` to ``memory_mb``, ``shm_rmid_forced`` to 1 (a
  segment nobody has attached is destroyed, so every live one is mapped somewhere
  and counts against that process's RLIMIT_AS) and ``msgmni`` to ``MSG_QUEUES``
  (message queues hold kernel memory: 32,000 queues of 16 KB by default). /proc/sys is read-only inside, so the
  sandbox cannot set them back. This needs a root server (as a plain user, joining
  the sandbox's IPC namespace is refused); ``ipc_unavailable_reason`` says.
- memfd files (``memfd_create``): held by a file descriptor or a mapping, never by
  a name. ``MemfdWatch`` adds up the blocks of the distinct memfd files the
  sandbox's processes hold (``/proc/PID/fd`` and ``/proc/PID/map_files``; a server
  that may not read map_files counts the mapped ranges from ``/proc/PID/maps``)
  and, past ``memory_mb`` for the sandbox as a whole, kills every process of it
  (``cap="memory"``). It measures when the host's shared memory (``Shmem`` in
  /proc/meminfo) grew by half the headroom, at most every ``POLL`` seconds, and at
  least every ``SAFETY_SCAN`` seconds. Not counted: a memfd whose only reference is
  a file descriptor in flight in a Unix socket (``SCM_RIGHTS`` to itself, then
  closed): no /proc file shows it; each is bounded by ``file_size_mb``, and the
  kernel bounds a user's descriptors in flight by its RLIMIT_NOFILE.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import stat
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterable

from rollserve.sandbox.base import SandboxLimits
from rollserve.sandbox.host import find_binary, setpriv_argv
from rollserve.sandbox.watch import MB, Readings, TickedWatch

log = logging.getLogger(__name__)

POLL = 0.25  # seconds between two reads of the host's Shmem
SAFETY_SCAN = 10.0  # seconds: a scan at least this often
MIN_TRIGGER = 1 << 20
MSG_QUEUES = 64  # SysV message queues per command (kernel.msgmni)
PAGE = os.sysconf("SC_PAGE_SIZE")

MEMFD_MECHANISM = (
    "memfd files the sandbox's processes hold (fd or mapping): a watcher in "
    "the server adds them up for the whole sandbox; past memory_mb every "
    "process of the sandbox is killed"
)
MEMFD_NOT_ROOT = (
    "the server is not root and may not read /proc/PID/map_files: of a memfd "
    "kept only by a mapping, only the mapped range counts"
)


def ipc_sysctls(limits: SandboxLimits) -> dict[str, int]:
    """The IPC namespace's sysctls (under /proc/sys/kernel) for ``limits``."""
    total = limits.memory_mb * MB
    return {"shmmax": total, "shmall": max(1, total // PAGE), "shm_rmid_forced": 1, "msgmni": MSG_QUEUES}


def nsenter_argv(pid: int, uid: int, values: dict[str, int]) -> list[str]:
    """A command that sets ``values`` in the IPC namespace of ``pid``: as host root,
    or else as ``uid``, the sandbox's (whichever owns them there at that moment)."""
    writes = " && ".join(f"echo {v} > /proc/sys/kernel/{k}" for k, v in values.items())
    as_uid = f'setpriv --reuid={uid} --regid={uid} --clear-groups -- sh -c "{writes}"'
    return ["nsenter", f"--target={pid}", "--ipc", "--", "sh", "-c", f"{{ {writes}; }} 2>/dev/null || {as_uid}"]


async def cap_ipc(pid: int, uid: int, limits: SandboxLimits, timeout: float = 10.0) -> None:
    """Set the SysV IPC caps in the namespace of ``pid``, a sandbox's first process
    that bwrap holds before its command (``--block-fd``), whose uid is ``uid``;
    OSError (with nsenter's words) if that fails. Those sysctls belong to the
    sandbox's uid (hence /proc/sys read-only inside) once bwrap has mapped its user
    namespace, to host root before; bwrap may be writing that map right then, so a
    refused write is tried again (up to 8 times, backing off, within ``timeout``)."""
    deadline = time.monotonic() + timeout
    error = ""
    pause = 0.01
    for _ in range(8):  # a loaded host can take a while to finish the map
        process = await asyncio.create_subprocess_exec(
            *nsenter_argv(pid, uid, ipc_sysctls(limits)),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            _, err = await asyncio.wait_for(process.communicate(), max(0.1, deadline - time.monotonic()))
        except TimeoutError:
            process.kill()
            await process.wait()
            raise OSError(f"capping System V IPC took over {timeout} s") from None
        if process.returncode == 0:
            return
        error = err.decode(errors="replace").strip()[-300:]
        if time.monotonic() + pause >= deadline:
            break
        await asyncio.sleep(pause)
        pause = min(0.5, pause * 2)
    raise OSError(f"capping System V IPC failed: {error}")


@functools.lru_cache(maxsize=4)
def ipc_unavailable_reason(bwrap: str, as_root: bool, uid: int) -> str | None:
    """Why this server cannot cap System V IPC in its sandboxes' namespaces (None: it
    can), from one tiny sandbox (as ``uid``, held at ``--block-fd`` as the runtime's
    are), once."""
    if not as_root:
        return "the server is not root: it may not enter its sandboxes' IPC namespaces"
    if find_binary(["nsenter"]) is None:
        return "nsenter (util-linux) is not on PATH"
    info_r, info_w = os.pipe()
    block_r, block_w = os.pipe()
    argv = [
        *setpriv_argv(uid),
        "--",
        bwrap,
        "--unshare-all",
        "--ro-bind",
        "/",
        "/",
        "--proc",
        "/proc",
        "--info-fd",
        str(info_w),
        "--block-fd",
        str(block_r),
        "--",
        "true",
    ]
    try:
        box = subprocess.Popen(argv, pass_fds=(info_w, block_r), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError as error:
        os.close(block_w)
        return f"a test sandbox failed: {error}"
    finally:
        os.close(info_w)
        os.close(block_r)
    try:
        with os.fdopen(info_r, "rb") as info:
            pid = int(json.loads(info.read())["child-pid"])
        done = subprocess.run(
            nsenter_argv(pid, uid, {"shm_rmid_forced": 1}), check=False, capture_output=True, text=True, timeout=10
        )
        if done.returncode != 0:
            return f"nsenter failed: {done.stderr.strip()[-200:]}"
        return None
    except (OSError, ValueError, KeyError, subprocess.TimeoutExpired) as error:
        return f"a test sandbox failed: {error}"
    finally:
        os.close(block_w)  # (EOF: bwrap goes on, runs `true`)
        try:
            box.wait(timeout=10)
        except subprocess.TimeoutExpired:
            box.kill()
            box.wait()


def shmem_bytes() -> int:
    """The host's shared memory in use (``Shmem`` of /proc/meminfo), in bytes."""
    with open("/proc/meminfo", "rb") as meminfo:
        for line in meminfo:
            if line.startswith(b"Shmem:"):
                return int(line.split()[1]) * 1024
    return 0


def memfd_usage(pids: Iterable[int]) -> int:
    """Bytes held by the distinct memfd files that processes ``pids`` have open or
    mapped (allocated blocks: a sparse memfd costs what it holds)."""
    seen: set[int] = set()
    total = 0
    for pid in pids:
        for link_dir in (f"/proc/{pid}/fd", f"/proc/{pid}/map_files"):
            try:
                names = os.listdir(link_dir)
            except PermissionError:  # map_files: root only; count the mapped ranges
                total += _mapped_memfds(pid, seen)
                continue
            except OSError:  # exited
                break
            for name in names:
                try:
                    if not os.readlink(f"{link_dir}/{name}").startswith("/memfd:"):
                        continue
                    st = os.stat(f"{link_dir}/{name}")
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode) and st.st_ino not in seen:
                    seen.add(st.st_ino)
                    total += st.st_blocks * 512
    return total


def _mapped_memfds(pid: int, seen: set[int]) -> int:
    total = 0
    try:
        with open(f"/proc/{pid}/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and fields[5].startswith("/memfd:"):
                    inode = int(fields[4])
                    if inode not in seen:
                        seen.add(inode)
                        start, end = (int(x, 16) for x in fields[0].split("-"))
                        total += end - start
    except (OSError, ValueError):
        pass
    return total


class MemfdWatch(TickedWatch):
    """Keeps the memfd files of one sandbox's processes under ``limit`` bytes together:
    ``on_exceeded(used)`` kills them (the runtime's way); ``active()``: whether the
    sandbox has processes now (None: always counted as having some)."""

    period = POLL

    def __init__(
        self,
        limit: int,
        pids: Callable[[], Iterable[int]],
        on_exceeded: Callable[[int], Awaitable[None]],
        active: Callable[[], bool] | None = None,
    ) -> None:
        super().__init__(limit, pids, on_exceeded, active)
        self.used = 0  # at the last scan
        self.scans = 0
        self._last_shmem: int | None = None  # the host's Shmem at the last reading (its low point since the scan)
        self._last_scan = time.monotonic()

    def notice(self, used: int) -> str:
        return (
            f"\n[rollserve: this sandbox reached its memory cap: its processes hold "
            f"{used / MB:.1f} MB in memfd files, the cap is {self.limit / MB:.0f} MB for "
            "the whole sandbox; every process in the sandbox was killed.]\n"
        )

    async def check(self) -> int:
        """Measure now and enforce the cap; the usage in bytes."""
        self.used = await asyncio.to_thread(memfd_usage, list(self._pids()))
        self.scans += 1
        if self.used > self.limit:
            log.warning(
                "sandbox processes hold %d MB in memfd files, past the memory cap of %d MB: killing them",
                self.used // MB,
                self.limit // MB,
            )
            await self._on_exceeded(self.used)
        return self.used

    def due(self, now: float, readings: Readings) -> bool:
        """Read the host's Shmem (once per tick for every sandbox) and say whether the
        sandbox's memfd files are due to be added up."""
        shmem = readings.get("shmem")
        if shmem is None:
            shmem = readings["shmem"] = shmem_bytes()
        if self._last_shmem is None:
            self._last_shmem = shmem
            return False
        trigger = max(MIN_TRIGGER, (self.limit - self.used) // 2)
        if shmem - self._last_shmem >= trigger or now - self._last_scan >= SAFETY_SCAN:
            return True
        self._last_shmem = min(self._last_shmem, shmem)  # growth counts from the low point
        return False

    async def _checked(self) -> None:
        await self.check()
        self._last_shmem, self._last_scan = shmem_bytes(), time.monotonic()
