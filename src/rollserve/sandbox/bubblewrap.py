"""The ``bubblewrap`` runtime: the embedded default. Rootless, daemonless, ~ms starts.

One sandbox = two host folders (workspace, tmp) and any number of ``bwrap``
invocations over them: each ``exec`` and each ``spawn`` is its own bwrap, with its
own PID namespace, seeing the same /workspace and the same /tmp. So files are
shared (a shell, an interpreter and one-shot commands see each other's files), but
processes are not (``ps`` in one does not see the others). Starting a bwrap costs a
few ms, so there is no long-lived "container" process to keep alive or to leak.
Closing kills every live invocation, removes the folders and the owner record.

Each invocation:
  bwrap --unshare-all [--share-net] --die-with-parent --new-session
        --ro-bind-try <each top-level folder of / (or of the rootfs)> ...  (read-only)
        --tmpfs <hidden folders>  (/root, /home, /run, the state dir: empty, read-only)
        --ro-bind <extra read-only paths>  (the server's Python when a hidden folder
                                            covers it, e.g. pyenv under /root)
        --dev /dev --proc /proc --bind <workspace> /workspace --bind <tmp> /tmp
        --chdir /workspace --clearenv --setenv ... --hostname sandbox
        --info-fd I --block-fd B -- <command>
The root is not ``--ro-bind / /``: bwrap could not create /workspace in a read-only
root, so each top-level entry is bound (symlinks such as /bin -> usr/bin recreated).
/run is hidden because a read-only bind does not stop connect() on host Unix sockets
(docker.sock, D-Bus): the kernel's read-only check skips sockets.
Hiding /root and /home also hides a Python built there (pyenv, conda), so the
server's own interpreter is bound back read-only (``share_interpreter``), with any
``readonly_paths``. Not as root, though, when the path is under a folder closed to
others (/root is mode 700): bwrap then runs as the sandbox's uid and cannot reach it;
the path is left out with a warning (``handlers.sandboxed.find_python`` falls back
to a python3 of the same version inside, with the server's site-packages).

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
  are then bounded for the sandbox as a whole, and RLIMIT_AS is dropped.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import resource
import secrets
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
from pydantic import BaseModel, ConfigDict, Field

from rollserve.sandbox import cgroups
from rollserve.sandbox import limits as rl
from rollserve.sandbox.base import (WORKDIR, ExecResult, Runtime, SandboxError, SandboxProcess,
                                    SandboxSpec, resolve_in_workspace)
from rollserve.sandbox.common import FolderSandbox, shell_argv
from rollserve.sandbox.folders import SandboxFolders, chown_up_to, new_sandbox_id
from rollserve.sandbox.owner import OwnerBook, OwnerEntry, remove_tree
from rollserve.sandbox.process import HostProcess, collect

log = logging.getLogger(__name__)

SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Not bound from the host root: replaced (dev, proc, tmp, workspace) or useless.
SKIPPED = {"dev", "proc", "tmp", WORKDIR.strip("/"), "lost+found"}


class BubblewrapConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    bwrap: str = "bwrap"
    root: Path | None = Field(None, description="where sandbox folders go (None: system temp)")
    root_uids: tuple[int, int] | None = Field(
        (1_100_000_000, 100_000_000),
        description="(first, count): when the server is root, each sandbox runs as a "
        "random uid (and gid) from this range, used by no real user. None: sandboxes "
        "run as root (then the pids limit needs a cgroup)")
    hide: list[str] = Field(
        default_factory=lambda: ["/root", "/home", "/run", "/var/tmp"],
        description="host folders replaced by an empty read-only tmpfs")
    cgroup: str | None = Field("auto", description="'auto', 'off' or a delegated cgroup v2 folder")
    readonly_paths: list[str] = Field(
        default_factory=list,
        description="host paths also shown read-only inside, at the same place (even "
        "under a hidden folder, or with a rootfs image)")
    share_interpreter: bool = Field(
        True,
        description="over the host root, show this server's Python (sys.prefix, "
        "sys.base_prefix) read-only where a hidden folder covers it, e.g. a pyenv or "
        "conda build under /root or /home: the python and IPython tools run it")


def root_binds(root: str) -> list[str]:
    """bwrap arguments that show ``root``'s top level read-only at /.

    Listed afresh for every sandbox, and bound with ``--ro-bind-try``: a top-level
    folder removed after the listing (while a sandbox is open, or between two
    sandboxes) is left out instead of failing every later command with bwrap's
    ``Can't find source path``."""
    args: list[str] = []
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if entry.name in SKIPPED:
            continue
        target = "/" + entry.name
        try:
            if entry.is_symlink():
                args += ["--symlink", os.readlink(entry.path), target]
            elif entry.is_dir() or entry.is_file():
                args += ["--ro-bind-try", entry.path, target]
        except OSError:  # gone between scandir and here
            continue
    return args


class BwrapProcess(HostProcess):
    """A bwrap invocation; killing it also kills the sandbox's first process (pid 1
    of its PID namespace, whose death takes every process of the namespace along)."""

    sandbox_init: psutil.Process | None = None

    def kill_now(self) -> None:
        if self.sandbox_init is not None and self.returncode is None:
            try:
                self.sandbox_init.kill()  # psutil checks the start time first
            except psutil.Error:
                pass
        super().kill_now()


class BubblewrapRuntime(Runtime):
    name = "bubblewrap"

    def __init__(self, state_dir: Path | str | None = None,
                 config: BubblewrapConfig | None = None):
        self.config = config or BubblewrapConfig()
        self.state_dir = Path(state_dir).resolve() if state_dir is not None else None
        self.book = OwnerBook(state_dir)
        self._uids: set[int] = set()  # uids of this runtime's open sandboxes (root only)
        self.as_root = os.geteuid() == 0
        self.cgroup_parent, self.cgroup_reason = cgroups.find_parent(self.config.cgroup)
        self._skipped_paths: set[str] = set()  # read-only paths warned about

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return bwrap_unavailable_reason("bwrap")

    def limits_note(self) -> str:
        """How the limits are enforced here (for logs and the docs)."""
        if self.cgroup_parent is not None:
            return f"cgroup v2 under {self.cgroup_parent} (memory, pids) + rlimits"
        if self.as_root and self.config.root_uids is None:
            return "rlimits; pids NOT enforced (root, no cgroup, root_uids=None)"
        if self.as_root:
            return "rlimits (a uid of its own per sandbox: pids per sandbox)"
        return "rlimits (pids per sandbox user namespace)"

    def _pick_uid(self) -> int | None:
        if not self.as_root or self.config.root_uids is None:
            return None
        first, count = self.config.root_uids
        while True:
            uid = first + secrets.randbelow(count)
            if uid not in self._uids:
                self._uids.add(uid)
                return uid

    async def start(self, spec: SandboxSpec) -> "BubblewrapSandbox":
        reason = bwrap_unavailable_reason(self.config.bwrap)
        if reason:
            raise SandboxError(reason)
        root = spec.image or "/"
        if not os.path.isdir(root):
            raise SandboxError(f"bubblewrap: image {root!r} is not a rootfs folder")
        sandbox_id = new_sandbox_id(self.name)
        uid = self._pick_uid()
        try:
            folders = SandboxFolders.create(self.config.root, sandbox_id, uid, uid)
            folders.write_files(spec, uid, uid)
            cgroup = None
            if self.cgroup_parent is not None:
                cgroup = cgroups.create(self.cgroup_parent, f"rollserve-{sandbox_id}", spec.limits)
            entry = self.book.open(sandbox_id, self.name, [folders.base],
                                   cgroup=str(cgroup) if cgroup else None)
        except (OSError, ValueError) as error:
            self._uids.discard(uid)
            raise SandboxError(f"bubblewrap sandbox could not start: {error}") from error
        sandbox = BubblewrapSandbox(self, sandbox_id, spec, folders, entry, cgroup, root, uid)
        await sandbox.seed()
        return sandbox

    def hidden(self) -> list[str]:
        """Host folders to cover with an empty read-only tmpfs (outermost only: a
        folder inside a covered one is gone already, and could not be mounted on)."""
        candidates = [Path(p) for p in self.config.hide]
        # Other sandboxes' workspaces and the store (task instances, answers) are
        # nobody's business inside a sandbox. (/tmp is replaced as a whole anyway.)
        candidates += [p.resolve() for p in (self.state_dir, self.config.root) if p is not None]
        folders = [p for p in candidates if p.is_dir() and not p.is_symlink()
                   and p != Path("/") and Path("/tmp") not in (p, *p.parents)]
        return [str(p) for p in folders
                if not any(other in p.parents for other in folders)]

    def readonly_paths(self, root: str = "/") -> list[str]:
        """Host paths bound read-only inside on top of the root: the configured ones,
        and (over the host root) the server's Python where a hidden folder covers it.

        A path the sandbox's user cannot reach is left out, with a warning once: as
        root, sandboxes run as a uid of their own, and bwrap (running as that uid)
        cannot bind a path under a folder closed to others, such as /root (mode 700).
        """
        configured = [Path(p).resolve() for p in self.config.readonly_paths]
        interpreter = []
        if root == "/" and self.config.share_interpreter:
            # /tmp counts as hidden here: every sandbox sees its own private /tmp.
            hidden = [Path(h) for h in self.hidden()] + [Path("/tmp")]
            for prefix in dict.fromkeys((sys.prefix, sys.base_prefix)):
                real = Path(prefix).resolve()
                if any(h == real or h in real.parents for h in hidden):
                    interpreter.append(real)
        usable = []
        for path in dict.fromkeys([*configured, *interpreter]):
            why = None if path.exists() else "does not exist"
            if why is None and self.as_root and self.config.root_uids is not None:
                why = _closed_to_others(path)
            if why is None:
                usable.append(str(path))
            elif str(path) not in self._skipped_paths:
                self._skipped_paths.add(str(path))
                # The interpreter has a fallback (find_python); a configured path has none.
                log.log(logging.WARNING if path in configured else logging.INFO,
                        "bubblewrap: read-only path %s is not shown in sandboxes: %s", path, why)
        return usable


def _closed_to_others(path: Path) -> str | None:
    """Why a uid that is neither owner nor group could not reach ``path``, or None."""
    for folder in [*reversed(path.parents), path]:
        mode = folder.stat().st_mode
        if not mode & stat.S_IXOTH:
            return (f"{folder} is closed to other users (mode {stat.filemode(mode)}), and "
                    "sandboxes of a root server run as a uid of their own")
    return None


@functools.lru_cache(maxsize=4)
def bwrap_unavailable_reason(binary: str) -> str | None:
    if shutil.which(binary) is None:
        return f"bubblewrap: {binary!r} is not on PATH (apt-get install bubblewrap)"
    # Unprivileged user namespaces may be off (sysctl, or AppArmor on Ubuntu 24.04):
    # one tiny sandbox, once, says so plainly (as root: as a sandbox uid would run).
    probe = [binary, "--unshare-all", "--ro-bind", "/", "/", "--", "true"]
    if os.geteuid() == 0:
        uid = str(BubblewrapConfig().root_uids[0])
        probe = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", *probe]
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"bubblewrap: a test sandbox failed: {error}"
    if done.returncode != 0:
        return (f"bubblewrap: a test sandbox failed ({done.stderr.strip()[-300:]}); "
                "are unprivileged user namespaces enabled?")
    return None


class BubblewrapSandbox(FolderSandbox):
    runtime = "bubblewrap"

    def __init__(self, owner: BubblewrapRuntime, sandbox_id: str, spec: SandboxSpec,
                 folders: SandboxFolders, entry: OwnerEntry, cgroup: Path | None, root: str,
                 uid: int | None):
        self._setup(sandbox_id, spec, folders, entry)
        self.uid = uid  # the host uid it runs as (None: the server's)
        self.cgroup = cgroup
        self._owner = owner
        # With a cgroup, memory is bounded per sandbox there; RLIMIT_AS would only
        # break programs that reserve more address space than they use.
        values = rl.rlimits(spec.limits, nproc=True, address_space=cgroup is None)
        nproc = values.pop(resource.RLIMIT_NPROC)
        if owner.as_root and uid is None:
            nproc = None  # root is exempt: only a cgroup bounds the pids
        elif uid is not None:
            values[resource.RLIMIT_NPROC] = nproc  # its own uid: set before bwrap
            nproc = None
        self._nproc = nproc  # else: set in the block-fd window, inside the user namespace
        self._prefix = rl.prlimit_argv(values)
        if uid is not None:
            self._prefix += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                             "--inh-caps=-all", "--"]
        self._root = root
        self._args = self._bwrap_args(root)

    def _bwrap_args(self, root: str) -> list[str]:
        config = self._owner.config
        args = [config.bwrap, "--unshare-all", "--die-with-parent", "--new-session"]
        if self.spec.network:
            args.append("--share-net")
        args += root_binds(root)
        hidden = self._owner.hidden()
        for folder in hidden:
            args += ["--tmpfs", folder]
        # Bound before the covering tmpfs turns read-only: bwrap makes the mount points.
        # Paths under /tmp are bound after the private /tmp below, which would cover them.
        readonly = self._owner.readonly_paths(root)
        under_tmp = [p for p in readonly if Path("/tmp") in Path(p).parents]
        for path in readonly:
            if path not in under_tmp:
                args += ["--ro-bind", path, path]
        for folder in hidden:
            args += ["--remount-ro", folder]
        if self.spec.network and root == "/":
            # /run is hidden, but DNS may live there (systemd-resolved's stub file).
            resolv = os.path.realpath("/etc/resolv.conf")
            if resolv != "/etc/resolv.conf":
                args += ["--ro-bind-try", resolv, resolv]
        args += ["--dev", "/dev", "--proc", "/proc",
                  "--bind", str(self.folders.workspace), WORKDIR,
                  "--bind", str(self.folders.tmp), "/tmp"]
        for alias in self.workspace_aliases():
            args += ["--bind", str(self.folders.workspace), alias]
        for path in under_tmp:
            args += ["--ro-bind", path, path]
        args += ["--chdir", WORKDIR, "--hostname", "sandbox", "--clearenv"]
        return args

    def _env_args(self, env: dict[str, str] | None, pty: bool) -> list[str]:
        # HOME is the private /tmp, not the workspace: caches (pip, IPython, matplotlib)
        # and dotfiles stay out of the agent's files and a task's diff.
        values = {"PATH": SANDBOX_PATH, "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
                  "LC_ALL": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
        if pty:
            values["TERM"] = "xterm"
        values.update(self.spec.env)
        values.update(env or {})
        args: list[str] = []
        for key, value in values.items():
            args += ["--setenv", key, value]
        return args

    async def _launch(self, inner: list[str], pty: bool, env: dict[str, str] | None,
                      merge_stderr: bool) -> BwrapProcess:
        self._check_open()
        if pty:
            # In its own session with the PTY as controlling terminal: job control,
            # and b"\x03" interrupts the foreground job. (--wait: should setsid have to
            # fork, the command's exit status still comes back.)
            inner = ["setsid", "--ctty", "--wait", *inner]
        info_r, info_w = os.pipe2(os.O_CLOEXEC)
        block_r, block_w = os.pipe2(os.O_CLOEXEC)
        # prlimit and setpriv (util-linux) set the limits and drop to the sandbox's uid
        # just before bwrap; Popen(preexec_fn=..., user=...) would do the same but
        # disables CPython's vfork fast path.
        # (While seeding, without the aliases: they would hide the seed.)
        mounts = self._bwrap_args(self._root) if self._seeding else self._args
        argv = [*self._prefix, *mounts, "--info-fd", str(info_w), "--block-fd", str(block_r),
                *self._env_args(env, pty), "--", *inner]
        try:
            process = BwrapProcess.start(argv, pty=pty, env={"PATH": os.environ.get("PATH", SANDBOX_PATH)},
                                         merge_stderr=merge_stderr, pass_fds=(info_w, block_r),
                                         contained=True)
        except OSError as error:
            raise SandboxError(f"sandbox {self.id}: cannot start bwrap: {error}") from error
        finally:
            os.close(info_w)
            os.close(block_r)
        self._processes.add(process)
        process.on_exit(self._forget)
        try:
            info = await asyncio.wait_for(_read_all(info_r), self.spec.start_timeout)
            pid = int(json.loads(info)["child-pid"])
            process.sandbox_init = psutil.Process(pid)
            if self._nproc is not None:
                rl.apply(pid, {resource.RLIMIT_NPROC: self._nproc})
            if self.cgroup is not None:
                cgroups.add_process(self.cgroup, pid)
            self._entry.add(process.pid, pid)
            os.write(block_w, b"1")  # go
        except (asyncio.TimeoutError, ValueError, KeyError, OSError, psutil.Error) as error:
            detail = await _failure_output(process)
            await process.kill()
            if isinstance(error, asyncio.TimeoutError):
                detail = f"no start within {self.spec.start_timeout}s. {detail}"
            raise SandboxError(f"sandbox {self.id}: bwrap failed to start: {detail}".strip()) from error
        finally:
            os.close(info_r)
            os.close(block_w)
        return process

    def _forget(self, process: HostProcess) -> None:
        self._processes.discard(process)
        pids = [process.pid]
        if isinstance(process, BwrapProcess) and process.sandbox_init is not None:
            pids.append(process.sandbox_init.pid)
        self._entry.discard(*pids)

    async def exec(self, command: str | list[str], timeout: float, stdin: bytes | None = None,
                   env: dict[str, str] | None = None, max_output: int = 1 << 20) -> ExecResult:
        started = time.monotonic()
        process = await self._launch(shell_argv(command), pty=False, env=env, merge_stderr=False)
        # bwrap exits 128+N when the command dies of signal N: read back as a signal.
        return await collect(process, timeout, stdin, max_output, signal_codes=True,
                             started=started)

    async def spawn(self, argv: list[str], pty: bool = False, env: dict[str, str] | None = None,
                    *, merge_stderr: bool = True) -> SandboxProcess:
        return await self._launch(list(argv), pty=pty, env=env, merge_stderr=merge_stderr)

    async def write_file(self, path: str, data: bytes | str) -> None:
        await super().write_file(path, data)
        if self.uid is not None:  # the sandbox's uid must be able to change it
            chown_up_to(resolve_in_workspace(self.workspace, path), self.workspace.resolve(),
                        self.uid, self.uid)

    async def close(self) -> None:
        if not await self._begin_close():
            return
        if self.cgroup is not None:
            await asyncio.to_thread(cgroups.remove_cgroup, self.cgroup)
        await asyncio.to_thread(remove_tree, self.folders.base)
        self._entry.delete()
        self._owner._uids.discard(self.uid)


async def _read_all(fd: int) -> bytes:
    """Read a pipe to EOF through the event loop (bwrap's --info-fd JSON)."""
    loop = asyncio.get_running_loop()
    os.set_blocking(fd, False)
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            ready = loop.create_future()
            loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
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
        except (asyncio.TimeoutError, OSError):
            pass
    return out.decode("utf-8", "replace").strip()

