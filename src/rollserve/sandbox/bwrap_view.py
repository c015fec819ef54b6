"""What a bubblewrap sandbox sees, as bwrap arguments (the runtime is bubblewrap.py),
and whether bwrap can make sandboxes here at all (``bwrap_unavailable_reason``).

Each invocation:
  bwrap --unshare-all [--share-net] --die-with-parent --new-session
        --ro-bind-try <each top-level folder of / (or of the rootfs)> ...  (read-only)
        --size <tmpfs_mb> --tmpfs <hidden folders>  (/root, /home, /run, the state
                                            dir: empty, read-only)
        --ro-bind <extra read-only paths>  (the base interpreter and the sandboxes'
                                            own Python when a hidden folder covers
                                            them, e.g. pyenv under /root)
        --dev /dev --proc /proc --ro-bind /proc/sys /proc/sys
        --bind <workspace> /workspace --bind <tmp> /tmp
        --ro-bind <server folder> /.rollserve  (the server's alone: the gateway socket)
        --ro-bind <host folder> <inside>      (the spec's readonly_binds: a harness's install)
        --perms 1777 --size <tmpfs_mb> --tmpfs /dev/shm
        --remount-ro /dev --remount-ro /
        --chdir /workspace --clearenv --setenv ... --hostname sandbox
        --info-fd I --block-fd B -- <command>
The root is not ``--ro-bind / /``: bwrap could not create /workspace in a read-only
root, so each top-level entry is bound (symlinks such as /bin -> usr/bin recreated),
listed afresh for every sandbox and bound with ``-try`` (a top-level folder removed
while the server runs must not break later sandboxes). The tmpfs bwrap builds that
root on, and the one under /dev, belong to the sandbox's user and have no size: both
are made read-only once everything is mounted. Every tmpfs the sandbox can write
(/dev/shm) is sized by ``tmpfs_mb``; a bwrap older than 0.7 cannot size one (no
``--size``), and /dev/shm is then a folder of the sandbox's, under the disk cap.
rollserve's own bundled datasets (the gold answers of math, code, stem, swe-mini) are
hidden wherever the host holds them (answers.py): every source checkout of rollserve
(work trees, git history, build leftovers) is a hidden folder, and the ``data``
folder of every installed copy is covered on top of everything else, since the host
root (or the server's Python bound back) would show it. Anything else world-readable
on the host is readable inside: keep task data in a hidden folder (``hide``) or use a
rootfs image.
/run is hidden because a read-only bind does not stop connect() on host Unix sockets
(docker.sock, D-Bus): the kernel's read-only check skips sockets.
Hiding /root and /home also hides a Python built there (pyenv, conda), so the
server's base interpreter (its binary and standard library) and the sandboxes' own
Python (sandbox_python.py) are bound back read-only (``share_interpreter``), with any
``readonly_paths``. Not as root, though, when the path is under a folder closed to
others (/root is mode 700): bwrap then runs as the sandbox's uid and cannot reach it;
the path is left out with a warning (``handlers.sandboxed.python_with`` falls back
to a python3 of the same version inside, with the sandboxes' own site-packages).
The server's packages are never shown (server_python.py): its venv is hidden, and
every site dir the view would show (the base interpreter's bound back, one on the
host root) is covered by an empty read-only tmpfs, last.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path

from rollserve.sandbox.answers import answer_folders, checkouts
from rollserve.sandbox.base import SERVER_DIR, WORKDIR, SandboxLimits
from rollserve.sandbox.config import BubblewrapConfig
from rollserve.sandbox.diskcap import MB
from rollserve.sandbox.folders import SandboxFolders
from rollserve.sandbox.host import find_binary, missing_binary, setpriv_argv
from rollserve.sandbox.server_python import base_prefix, closed_to_others, server_venv, site_dirs, within

log = logging.getLogger(__name__)

# Not bound from the host root: replaced (dev, proc, tmp, workspace) or useless.
SKIPPED = {"dev", "proc", "tmp", WORKDIR.strip("/"), "lost+found"}


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


@functools.lru_cache(maxsize=4)
def bwrap_options(binary: str) -> frozenset[str]:
    """The options ``binary`` knows, from its --help (empty if it cannot run)."""
    try:
        done = subprocess.run([binary, "--help"], check=False, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return frozenset()
    return frozenset(re.findall(r"^\s+(--[a-z0-9-]+)", done.stdout + done.stderr, re.MULTILINE))


def _resolver_bind() -> list[str]:
    """/run is hidden, but DNS may live there (systemd-resolved's stub file): where
    /etc/resolv.conf links to, bound read-only (if it is there)."""
    resolv = os.path.realpath("/etc/resolv.conf")
    return ["--ro-bind-try", resolv, resolv] if resolv != "/etc/resolv.conf" else []


def _shm(size: list[str], folders: SandboxFolders) -> list[str]:
    """/dev/shm: a sized, world-writable tmpfs where bwrap sizes one, else the sandbox's
    own folder bound there."""
    if size:
        return ["--perms", "1777", *size, "--tmpfs", "/dev/shm"]
    return ["--bind", str(folders.base / "shm"), "/dev/shm"]


class View:
    """The mounts of a runtime's sandboxes: ``args()`` for one sandbox."""

    def __init__(self, config: BubblewrapConfig, state_dir: Path | None, as_root: bool):
        self.config = config
        self.state_dir = state_dir
        self.as_root = as_root
        # bwrap 0.7+ sizes a tmpfs (--size); older ones (RHEL 9 ships 0.4) cannot.
        self.sized_tmpfs = {"--size", "--perms"} <= bwrap_options(config.bwrap)
        self._skipped_paths: set[str] = set()  # read-only paths warned about
        # The sandboxes' own Python (sandbox_python.py), once the runtime has made it.
        self.python_prefix: Path | None = None

    def args(
        self,
        root: str,
        folders: SandboxFolders,
        limits: SandboxLimits,
        network: bool,
        aliases: Sequence[str],
        hide: Sequence[str] = (),
        own: Sequence[str] = (),
        binds: dict[str, str] | None = None,
    ) -> list[str]:
        """bwrap's arguments up to the environment (see the module's doc); ``hide``:
        more host folders to cover (the spec's); ``binds``: inside -> host folder,
        read-only (the spec's ``readonly_binds``)."""
        args = [self.config.bwrap, "--unshare-all", "--die-with-parent", "--new-session"]
        if network:
            args.append("--share-net")
        args += root_binds(root)
        # Every tmpfs is sized (tmpfs_mb): unsized, each could take half the host's RAM.
        size = ["--size", str(limits.tmpfs_mb * MB)] if self.sized_tmpfs else []
        hidden = self.hidden(hide)
        for folder in hidden:
            args += [*size, "--tmpfs", folder]
        # Bound before the covering tmpfs turns read-only: bwrap makes the mount points.
        # Paths under /tmp are bound after the private /tmp below, which would cover them.
        readonly = self.readonly_paths(root)
        under_tmp = [p for p in readonly if Path("/tmp") in Path(p).parents]
        for path in readonly:
            if path not in under_tmp:
                args += ["--ro-bind", path, path]
        for folder in hidden:
            args += ["--remount-ro", folder]
        if network and root == "/":
            args += _resolver_bind()
        # /proc/sys read-only: the IPC namespace's caps (shmcap.py) belong to the
        # sandbox's uid, who could otherwise set them back.
        args += [
            "--dev",
            "/dev",
            "--proc",
            "/proc",
            "--ro-bind",
            "/proc/sys",
            "/proc/sys",
            "--bind",
            str(folders.workspace),
            WORKDIR,
            "--bind",
            str(folders.tmp),
            "/tmp",
        ]
        args += _shm(size, folders)
        args += _binds(folders, aliases, own)
        args += ["--ro-bind", str(folders.server), SERVER_DIR]
        binds = {**(binds or {}), **{path: path for path in under_tmp}}
        for inside, host in binds.items():
            args += ["--ro-bind", host, inside]
        # Last, on top of whatever shows them (the root, or the server's Python bound
        # back): the bundled datasets, and every folder of the server's packages.
        for covered in self.answers_shown(root, hidden, readonly) + self.sites_shown(root, hidden, readonly):
            args += [*size, "--tmpfs", covered, "--remount-ro", covered]
        # bwrap's own tmpfs at / (mount points) and at /dev (device nodes) are the
        # sandbox user's and unsized: read-only once everything is mounted.
        args += ["--remount-ro", "/dev", "--remount-ro", "/"]
        args += ["--chdir", WORKDIR, "--hostname", "sandbox", "--clearenv"]
        return args

    @staticmethod
    def answers_shown(root: str, hidden: list[str], readonly: list[str]) -> list[str]:
        """The ``data`` folders of rollserve's installed copies (its bundled datasets,
        their gold answers) that this view would show: over the host root, those that
        no hidden folder nor the private /tmp covers, or that a read-only path brings
        back."""
        return _shown(answer_folders(), root, hidden, readonly)

    @staticmethod
    def sites_shown(root: str, hidden: list[str], readonly: list[str]) -> list[str]:
        """The server's site dirs and venv (``server_python.site_dirs``) that this view
        would show: over the host root, those that no hidden folder nor the private
        /tmp covers, or that a read-only path (the base interpreter's prefix) brings back."""
        return _shown(site_dirs(), root, hidden, readonly)

    def hidden(self, extra: Sequence[str] = ()) -> list[str]:
        """Host folders to cover with an empty read-only tmpfs (outermost only: a
        folder inside a covered one is gone already, and could not be mounted on)."""
        candidates = [Path(p) for p in self.config.hide] + [Path(p).resolve() for p in extra]
        # Other sandboxes' workspaces and the store (task instances, answers) are
        # nobody's business inside a sandbox. (/tmp is replaced as a whole anyway.)
        candidates += [p.resolve() for p in (self.state_dir, self.config.root) if p is not None]
        # Every source checkout of rollserve: its files, git history and build
        # leftovers hold the bundled datasets' answers (answers.py).
        candidates += checkouts()
        # The venv the server runs from (its site-packages, its scripts).
        venv = server_venv()
        candidates += [venv] if venv is not None else []
        folders = [
            p
            for p in candidates
            if p.is_dir() and not p.is_symlink() and p != Path("/") and Path("/tmp") not in (p, *p.parents)
        ]
        return [str(p) for p in folders if not any(other in p.parents for other in folders)]

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
            # The base interpreter (its standard library: its packages are covered, see
            # sites_shown), and the sandboxes' own Python (sandbox_python.py).
            made = [self.python_prefix] if self.python_prefix is not None else []
            interpreter = [p for p in [base_prefix(), *made] if within(p, hidden)]
        usable = []
        for path in dict.fromkeys([*configured, *interpreter]):
            why = None if path.exists() else "does not exist"
            if why is None and self.as_root and self.config.root_uids is not None:
                why = closed_to_others(path)
            if why is None:
                usable.append(str(path))
            elif str(path) not in self._skipped_paths:
                self._skipped_paths.add(str(path))
                # The interpreter has a fallback (python_with); a configured path has none.
                log.log(
                    logging.WARNING if path in configured else logging.INFO,
                    "bubblewrap: read-only path %s is not shown in sandboxes: %s",
                    path,
                    why,
                )
        return usable


def _shown(folders: Sequence[Path], root: str, hidden: list[str], readonly: list[str]) -> list[str]:
    """Of ``folders``, those a view over ``root`` would show: over the host root, those
    that no hidden folder nor the private /tmp covers, or that a read-only path brings back."""
    if root != "/":
        return []
    covering = [Path(f) for f in [*hidden, "/tmp"]]
    return [
        str(folder) for folder in folders if not within(folder, covering) or within(folder, [Path(p) for p in readonly])
    ]


INSTALL_HINT = "install bubblewrap (apt-get install bubblewrap, dnf install bubblewrap)"


@functools.lru_cache(maxsize=4)
def bwrap_unavailable_reason(binary: str, root_uid: int | None = None) -> str | None:
    """Why ``binary`` cannot make sandboxes here, or None. As root, the test sandbox
    runs as ``root_uid``, as a sandbox would."""
    if find_binary([binary]) is None:
        return f"bubblewrap: {missing_binary([binary], INSTALL_HINT)}"
    # Unprivileged user namespaces may be off (sysctl, or AppArmor on Ubuntu 24.04):
    # one tiny sandbox, once, says so plainly.
    probe = [binary, "--unshare-all", "--ro-bind", "/", "/", "--", "true"]
    if os.geteuid() == 0 and root_uid is not None:
        probe = [*setpriv_argv(root_uid), "--", *probe]
    try:
        done = subprocess.run(probe, check=False, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"bubblewrap: a test sandbox failed: {error}"
    if done.returncode != 0:
        return (
            f"bubblewrap: a test sandbox failed ({done.stderr.strip()[-300:]}); "
            "are unprivileged user namespaces enabled?"
        )
    return None


def _binds(folders: SandboxFolders, aliases: Sequence[str], own: Sequence[str]) -> list[str]:
    """The workspace at its aliases, and the spec's folders (the sandbox's own, beside
    the workspace) at theirs."""
    args: list[str] = []
    for alias in aliases:
        args += ["--bind", str(folders.workspace), alias]
    for path in own:
        args += ["--bind", str(folders.own(path)), path]
    return args
