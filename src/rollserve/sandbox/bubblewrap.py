"""The ``bubblewrap`` runtime: the embedded default. Rootless, daemonless, ~ms starts.

One sandbox = two host folders (workspace, tmp) and any number of ``bwrap``
invocations over them: each ``exec`` and each ``spawn`` is its own bwrap, with its
own PID namespace, seeing the same /workspace and the same /tmp. So files are
shared (a shell, an interpreter and one-shot commands see each other's files), but
processes are not (``ps`` in one does not see the others). Starting a bwrap costs a
few ms, so there is no long-lived "container" process to keep alive or to leak.
Closing kills every live invocation, removes the folders and the owner record.

What each invocation sees (its mounts, as bwrap arguments) is bwrap_view.py.

Limits (see limits.py for what each rlimit means). RLIMIT_NPROC is counted per
(user namespace, uid), and real uid 0 is exempt from it, so:

- server not root: bwrap makes a fresh user namespace for the server's uid. bwrap
  blocks on --block-fd after building the namespaces, before running the command; in
  that window we read the sandbox's first process from --info-fd and set its
  RLIMIT_NPROC (``resource.prlimit``; allowed: same uid). Set *inside* the new user
  namespace it counts exactly this sandbox's processes, not the uid's host-wide.
- server root: bwrap runs as a uid of its own per sandbox (picked at random from
  ``BubblewrapConfig.root_uids``, via ``setpriv``). RLIMIT_NPROC then counts exactly
  the sandbox's processes everywhere, so it is set like the other rlimits, before
  bwrap. (Setting it through the block-fd window would need CAP_SYS_RESOURCE, which
  root in some containers, this CI machine included, does not have.) As a bonus the
  sandbox cannot read root-only host files, and two sandboxes never share a uid.
- the other rlimits (address space, file size, CPU, open files, core) are set by
  ``prlimit`` in front of bwrap and inherited by everything in the sandbox.
- where a delegated cgroup v2 subtree exists (cgroups.py), the sandbox's first
  process is moved into a cgroup of its own in the block-fd window: memory and pids
  are then bounded for the sandbox as a whole, and RLIMIT_AS is dropped. A command
  that fails after the cgroup's OOM killer struck has ``cap="memory"``.
- the workspace and /tmp together are held under ``disk_mb`` by the disk cap's
  watcher (diskcap.py); /dev/shm is a tmpfs of ``tmpfs_mb`` (bwrap_view.py).
- a spec with ``memory_mode="resident"`` (the harness runs) and no cgroup: no
  RLIMIT_AS; a watcher holds the resident memory of all the sandbox's processes
  together under ``memory_mb`` (rsscap.py), killing every one of them past it
  (``cap="memory"``).
- shared memory that RLIMIT_AS does not see (shmcap.py): in the block-fd window, a
  root server caps System V IPC in the command's own IPC namespace; without a
  cgroup, a watcher holds the sandbox's memfd files under ``memory_mb``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import resource
import secrets
from pathlib import Path

import psutil

from rollserve.sandbox import cgroups, diskcap, rsscap, shmcap
from rollserve.sandbox import limits as rl
from rollserve.sandbox.base import (
    ExecResult,
    SandboxError,
    SandboxSpec,
    resolve_in_workspace,
)
from rollserve.sandbox.bwrap_view import View, bwrap_unavailable_reason
from rollserve.sandbox.common import FolderRuntime, FolderSandbox
from rollserve.sandbox.config import BubblewrapConfig
from rollserve.sandbox.folders import SandboxFolders, chown_up_to, new_sandbox_id
from rollserve.sandbox.host import setpriv_argv
from rollserve.sandbox.owner import OwnerEntry, OwnerRecord
from rollserve.sandbox.process import HostProcess
from rollserve.sandbox.sandbox_python import SandboxPython, default_cache

__all__ = ["BubblewrapConfig", "BubblewrapRuntime", "BubblewrapSandbox"]

log = logging.getLogger(__name__)

SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class BwrapProcess(HostProcess):
    """A bwrap invocation; killing it also kills the sandbox's first process (pid 1
    of its PID namespace, whose death takes every process of the namespace along)."""

    sandbox_init: psutil.Process | None = None

    def kill_now(self) -> None:
        self.kill_first()
        super().kill_now()

    def kill_first(self) -> None:
        """Kill the sandbox's first process itself, not only through bwrap's group: it
        leaves that group (--new-session), and it sets its parent-death signal only
        after the block fd, so a bwrap that dies first leaves it alive (PPID 1)."""
        if self.sandbox_init is not None:
            try:
                self.sandbox_init.kill()  # psutil checks the start time first
            except psutil.Error:
                pass


class BubblewrapRuntime(FolderRuntime[BubblewrapConfig]):
    name = "bubblewrap"
    config_model = BubblewrapConfig

    def __init__(self, state_dir: Path | str | None = None, config: BubblewrapConfig | None = None) -> None:
        super().__init__(state_dir, config or BubblewrapConfig())
        self._uids: set[int] = set()  # uids of this runtime's open sandboxes (root only)
        self.as_root = os.geteuid() == 0
        self.cgroup_parent, self.cgroup_reason = cgroups.find_parent(self.config.cgroup)
        self.view = View(self.config, self.state_dir, self.as_root)
        self.sized_tmpfs = self.view.sized_tmpfs
        self.hidden = self.view.hidden
        self.readonly_paths = self.view.readonly_paths
        # The sandboxes' own Python over the host root (sandbox_python.py), made at the first start.
        self.python = SandboxPython(
            self.config.python_cache
            or default_cache(self.config.root, self.as_root and self.config.root_uids is not None),
            self.config.python_packages,
        )
        # Why System V IPC is not capped in this runtime's sandboxes (None: it is):
        # one tiny sandbox, once per process (the server makes its runtime in a thread).
        uid = self.config.root_uids[0] if self.config.root_uids is not None else 0
        self.ipc_unavailable_reason: str | None = shmcap.ipc_unavailable_reason(self.config.bwrap, self.as_root, uid)

    @classmethod
    def unavailable_reason(cls, config: BubblewrapConfig | None = None) -> str | None:
        config = config or BubblewrapConfig()
        uid = config.root_uids[0] if config.root_uids is not None else None
        return bwrap_unavailable_reason(config.bwrap, uid)

    def caps(self) -> dict[str, str]:
        cgroup = self.cgroup_parent
        if cgroup is not None:
            memory = f"cgroup v2 memory.max for the whole sandbox, swap off (under {cgroup})"
            pids = f"cgroup v2 pids.max for the whole sandbox (under {cgroup})"
        else:
            memory = f"{rl.MEMORY_PER_PROCESS}; no cgroup: {self.cgroup_reason}"
            if self.as_root and self.config.root_uids is None:
                pids = "NOT enforced (server is root, no cgroup, root_uids=None)"
            elif self.as_root:
                pids = "RLIMIT_NPROC of the sandbox's own uid: per sandbox"
            else:
                pids = "RLIMIT_NPROC inside the sandbox's user namespace: per sandbox"
        ipc = self.ipc_unavailable_reason
        if ipc is None:
            memory += (
                "; System V shared memory: at most memory_mb per command (its own IPC "
                "namespace: shmall, shmmax; a segment no process has attached is "
                "destroyed, so each counts against RLIMIT_AS where mapped)"
            )
        else:
            memory += f"; System V shared memory: NOT capped ({ipc})"
        if cgroup is None:
            memory += f"; {shmcap.MEMFD_MECHANISM}"
            if not self.as_root:
                memory += f" ({shmcap.MEMFD_NOT_ROOT})"
        if self.sized_tmpfs:
            shm = (
                "/dev/shm and the hidden folders: tmpfs of this size per command "
                "(bwrap --size); bwrap's tmpfs at / and /dev read-only"
            )
        else:
            shm = (
                "/dev/shm: a host folder under the disk cap (this bwrap has no --size); "
                "bwrap's tmpfs at / and /dev read-only"
            )
        mode = rsscap.mode_caps(self.config.resident_poll, None if cgroup is None else f"the cgroup (under {cgroup})")
        return {
            "memory_mb": memory,
            "memory_mode": mode,
            "pids": pids,
            **rl.PER_PROCESS,
            "disk_mb": diskcap.MECHANISM,
            "tmpfs_mb": shm,
        }

    @classmethod
    def reap_resources(cls, record: OwnerRecord) -> list[str]:
        if not record.cgroup:
            return []
        try:
            cgroups.remove_cgroup(Path(record.cgroup))
        except OSError as error:
            return [f"{record.sandbox_id}: cgroup {record.cgroup}: {error}"]
        return []

    def _pick_uid(self) -> int | None:
        if not self.as_root or self.config.root_uids is None:
            return None
        first, count = self.config.root_uids
        while True:
            uid = first + secrets.randbelow(count)
            if uid not in self._uids:
                self._uids.add(uid)
                return uid

    def release_uid(self, uid: int | None) -> None:
        """A closed sandbox's uid, free for the next one."""
        if uid is not None:
            self._uids.discard(uid)

    async def start(self, spec: SandboxSpec) -> BubblewrapSandbox:
        reason = self.unavailable_reason(self.config)
        if reason:
            raise SandboxError(reason)
        root = spec.image or "/"
        if not os.path.isdir(root):
            raise SandboxError(f"bubblewrap: image {root!r} is not a rootfs folder")
        if root == "/" and self.config.share_interpreter:
            self.view.python_prefix = await self.python.get()
        sandbox_id = new_sandbox_id(self.name)
        uid = self._pick_uid()
        # The owner record first, naming the folder and cgroup about to be made: a server
        # killed from here on leaves a record the next one reaps (the reaper takes a
        # folder or cgroup that was never made), never an unowned folder.
        base = SandboxFolders.base_path(self.config.root, sandbox_id)
        name = f"rollserve-{sandbox_id}"
        planned = self.cgroup_parent / name if self.cgroup_parent is not None else None
        try:
            entry = self.book.open(sandbox_id, self.name, [base], cgroup=str(planned) if planned else None)
        except OSError as error:
            self.release_uid(uid)
            raise SandboxError(f"bubblewrap sandbox could not start: {error}") from error
        try:
            folders = SandboxFolders.create(self.config.root, sandbox_id, uid, uid)
            folders.write_files(spec, uid, uid)
            folders.make_own(spec.folders)
            if not self.sized_tmpfs:
                folders.make_shm(uid)
            cgroup = None
            if self.cgroup_parent is not None:
                cgroup = cgroups.create(self.cgroup_parent, name, spec.limits)
        except (OSError, ValueError) as error:
            self.release_uid(uid)
            await asyncio.to_thread(self.reap, entry.record)  # (blocking: folders, a cgroup)
            entry.delete()
            raise SandboxError(f"bubblewrap sandbox could not start: {error}") from error
        sandbox = BubblewrapSandbox(self, sandbox_id, spec, folders, entry, cgroup, root, uid)
        if root == "/" and self.config.share_interpreter and self.view.python_prefix is not None:
            sandbox.python_prefix = str(self.view.python_prefix)
        elif root == "/" and self.config.share_interpreter:
            sandbox.python_error = self.python.error
        sandbox.start_caps()
        await sandbox.seed()
        return sandbox


class BubblewrapSandbox(FolderSandbox):
    contains_processes = True  # each command's bwrap: its PID namespace dies with it

    def __init__(
        self,
        owner: BubblewrapRuntime,
        sandbox_id: str,
        spec: SandboxSpec,
        folders: SandboxFolders,
        entry: OwnerEntry,
        cgroup: Path | None,
        root: str,
        uid: int | None,
    ) -> None:
        # With a cgroup, memory is bounded per sandbox there; RLIMIT_AS would only
        # break programs that reserve more address space than they use. So would it
        # for a spec with memory_mode "resident" (rlimits leaves it out): rsscap.py.
        super().__init__(
            owner.name,
            sandbox_id,
            spec,
            folders,
            entry,
            resident_poll=owner.config.resident_poll,
            memory_bounded=cgroup is not None,
        )
        self.uid = uid  # the host uid it runs as (None: the server's)
        self.memfd: shmcap.MemfdWatch | None = None  # the memfd cap's watcher (no cgroup)
        self.cgroup = cgroup
        self._owner = owner
        values = rl.rlimits(spec.limits, nproc=True, address_space=cgroup is None)
        nproc: int | None = values.pop(resource.RLIMIT_NPROC)
        if owner.as_root and uid is None:
            nproc = None  # root is exempt: only a cgroup bounds the pids
        elif uid is not None and nproc is not None:
            values[resource.RLIMIT_NPROC] = nproc  # its own uid: set before bwrap
            nproc = None
        self._nproc = nproc  # else: set in the block-fd window, inside the user namespace
        # prlimit and setpriv (util-linux) set the limits and drop to the sandbox's uid
        # just before bwrap; Popen(preexec_fn=..., user=...) would do the same but
        # disables CPython's vfork fast path.
        self.prefix = rl.prlimit_argv(values)
        if uid is not None:
            self.prefix += [*setpriv_argv(uid), "--inh-caps=-all", "--"]
        self._root = root
        self.mounts = self._mounts()

    def _mounts(self) -> list[str]:
        """bwrap and its arguments up to the environment (bwrap_view.py)."""
        return self._owner.view.args(
            self._root,
            self.folders,
            self.spec.limits,
            self.spec.network,
            self.workspace_aliases(),
            self.spec.hide,
            self.spec.folders,
            self.spec.readonly_binds,
        )

    def _env_args(self, env: dict[str, str] | None, pty: bool) -> list[str]:
        # HOME is the private /tmp, not the workspace: caches (pip, IPython, matplotlib)
        # and dotfiles stay out of the agent's files and a task's diff.
        values = {
            "PATH": SANDBOX_PATH,
            "HOME": "/tmp",
            "TMPDIR": "/tmp",
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        if pty:
            values["TERM"] = "xterm"
        values.update(self.spec.env)
        values.update(env or {})
        args: list[str] = []
        for key, value in values.items():
            args += ["--setenv", key, value]
        return args

    async def _launch(
        self, inner: list[str], *, pty: bool, env: dict[str, str] | None, merge_stderr: bool
    ) -> BwrapProcess:
        info_r, info_w = os.pipe2(os.O_CLOEXEC)
        block_r, block_w = os.pipe2(os.O_CLOEXEC)
        # (While seeding, without the aliases: they would hide the seed.)
        mounts = self._mounts() if self._seeding else self.mounts
        argv = [
            *self.prefix,
            *mounts,
            "--info-fd",
            str(info_w),
            "--block-fd",
            str(block_r),
            *self._env_args(env, pty),
            "--",
            *inner,
        ]
        try:
            process = BwrapProcess.start(
                argv,
                pty=pty,
                env={"PATH": os.environ.get("PATH", SANDBOX_PATH)},
                merge_stderr=merge_stderr,
                pass_fds=(info_w, block_r),
                contained=True,
            )
        except OSError as error:
            os.close(info_r)
            os.close(block_w)
            raise SandboxError(f"sandbox {self.id}: cannot start bwrap: {error}") from error
        finally:
            os.close(info_w)
            os.close(block_r)
        self._track(process)
        started = False
        try:
            info = await asyncio.wait_for(_read_all(info_r), self.spec.start_timeout)
            pid = int(json.loads(info)["child-pid"])
            process.sandbox_init = psutil.Process(pid)
            process.on_exit(lambda _: process.kill_first())  # bwrap gone: so is the sandbox
            if self._nproc is not None:
                rl.apply(pid, {resource.RLIMIT_NPROC: self._nproc})
            if self.cgroup is not None:
                cgroups.add_process(self.cgroup, pid)
            if self._owner.ipc_unavailable_reason is None:
                await shmcap.cap_ipc(pid, os.geteuid() if self.uid is None else self.uid, self.spec.limits)
            self._record(process, pid)
            os.write(block_w, b"1")  # go
            started = True
        except (TimeoutError, ValueError, KeyError, OSError, psutil.Error) as error:
            process.kill_now()  # first: a cancel while its output is read must not let it go
            detail = await _failure_output(process)
            await process.kill()
            if isinstance(error, asyncio.TimeoutError):
                detail = f"no start within {self.spec.start_timeout}s. {detail}"
            else:  # what went wrong on our side (the IPC caps, the pid...), then bwrap's words
                detail = f"{type(error).__name__}: {error}. {detail}"
            raise SandboxError(f"sandbox {self.id}: bwrap failed to start: {detail}".strip()) from error
        except BaseException:
            # Cancelled mid-launch: killed before the block fd closes below (its EOF
            # would let the command start, without its limits, cgroup or record), and
            # its pipes closed (once it exits, the sandbox no longer tracks it).
            process.kill_now()
            process.close()
            raise
        finally:
            if not started:  # every way out before "go": nothing may start on the EOF
                process.kill_now()
            os.close(info_r)
            os.close(block_w)
        return process

    def start_caps(self) -> None:
        super().start_caps()
        if self.cgroup is None:  # (with one, the cgroup is charged for memfd files too)
            self.memfd = shmcap.MemfdWatch(
                self.spec.limits.memory_mb * shmcap.MB, self.host_pids, self._memfd_exceeded, self.caps_active()
            )
            self.memfd.start()

    async def _memfd_exceeded(self, used: int) -> None:
        assert self.memfd is not None
        await self.kill_for_cap("memory", self.memfd.notice(used))

    async def _stop_caps(self) -> None:
        await super()._stop_caps()
        if self.memfd is not None:
            await self.memfd.stop()

    async def exec(
        self,
        command: str | list[str],
        timeout: float,
        stdin: bytes | None = None,
        env: dict[str, str] | None = None,
        max_output: int = 1 << 20,
        *,
        cpu_budget: float | None = None,
    ) -> ExecResult:
        ooms = self._oom_kills()
        result = await super().exec(command, timeout, stdin, env, max_output, cpu_budget=cpu_budget)
        if result.cap is None and not result.ok and self._oom_kills() > ooms:
            result.cap = "memory"
            result.stderr += (
                f"\n[rollserve: the sandbox reached its memory cap "
                f"({self.spec.limits.memory_mb} MB for all its processes together); "
                "the kernel killed a process of it during this command.]\n"
            )
        return result

    def _oom_kills(self) -> int:
        """How many processes the sandbox's memory cap (its cgroup) has killed so far."""
        return cgroups.memory_events(self.cgroup).get("oom_kill", 0) if self.cgroup else 0

    async def write_file(self, path: str, data: bytes | str) -> None:
        await super().write_file(path, data)
        if self.uid is not None:  # the sandbox's uid must be able to change it
            chown_up_to(resolve_in_workspace(self.workspace, path), self.workspace.resolve(), self.uid, self.uid)

    async def _release(self) -> None:
        try:
            if self.cgroup is not None:
                await asyncio.to_thread(cgroups.remove_cgroup, self.cgroup)
        finally:
            self._owner.release_uid(self.uid)


async def _read_all(fd: int) -> bytes:
    """Read a pipe to EOF through the event loop (bwrap's --info-fd JSON)."""
    loop = asyncio.get_running_loop()
    os.set_blocking(fd, False)
    chunks: list[bytes] = []
    while True:
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            ready: asyncio.Future[None] = loop.create_future()

            def wake(ready: asyncio.Future[None] = ready) -> None:
                if not ready.done():
                    ready.set_result(None)

            loop.add_reader(fd, wake)
            try:
                await ready
            finally:
                loop.remove_reader(fd)
            continue
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


async def _failure_output(process: HostProcess) -> str:
    """What bwrap said before it failed (its stderr, or the PTY), briefly."""
    await process.wait(1.0)
    out = b""
    for read in (process.read_stderr, process.read):
        try:
            out += await asyncio.wait_for(read(4096), 0.2)
        except (TimeoutError, OSError):
            pass
    return out.decode("utf-8", "replace").strip()
