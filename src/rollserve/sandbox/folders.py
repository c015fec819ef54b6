"""The host folders of one sandbox: ``<root>/<id>/workspace`` and ``<root>/<id>/tmp``,
and ``<root>/<id>/server``: the server's own, shown read-only inside (``SERVER_DIR``;
the gateway's socket lives there, where no process of the sandbox can replace it).

One parent per sandbox, so closing (or reaping) removes a single tree. The default
root is the system temp folder: world-traversable, which matters when sandboxes run
as another uid than the server (bubblewrap as root drops to an unprivileged uid, and
that uid must reach the folder to bind it).
"""

from __future__ import annotations

import os
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from rollserve.sandbox.base import SandboxSpec, resolve_in_workspace


def new_sandbox_id(runtime: str) -> str:
    return f"{runtime[:4]}-{uuid.uuid4().hex[:16]}"


@dataclass
class SandboxFolders:
    base: Path
    workspace: Path
    tmp: Path
    server: Path  # the server's only (not chowned to the sandbox's uid); mounted read-only

    @staticmethod
    def base_path(root: Path | None, sandbox_id: str) -> Path:
        """Where ``create`` puts the sandbox's base folder (known before it exists, so
        its owner record can name it first: a server killed while it is being made
        leaves a record the next one reaps, never an unowned folder)."""
        root = Path(root) if root is not None else Path(tempfile.gettempdir())
        return root / f"rollserve-{sandbox_id}"

    @classmethod
    def create(
        cls, root: Path | None, sandbox_id: str, uid: int | None = None, gid: int | None = None
    ) -> SandboxFolders:
        base = cls.base_path(root, sandbox_id)
        base.parent.mkdir(parents=True, exist_ok=True)
        base.mkdir(mode=0o700)
        folders = cls(base, base / "workspace", base / "tmp", base / "server")
        folders.workspace.mkdir(mode=0o755)
        folders.server.mkdir(mode=0o755)
        # Searchable by the sandbox's uid, owned by the server's: what keeps a sandbox from
        # writing it is the read-only mount at /.rollserve (under `local`, nothing does).
        os.chmod(folders.server, 0o755)
        folders.tmp.mkdir(mode=0o1777)  # like /tmp: the sticky bit, whoever runs in it
        os.chmod(folders.tmp, 0o1777)  # (mkdir's mode is cut by the umask)
        if uid is not None:
            for path in (base, folders.workspace, folders.tmp):
                os.chown(path, uid, gid if gid is not None else -1)
        return folders

    def own(self, path: str) -> Path:
        """The host folder of a spec's ``folders`` path (``/tests`` -> ``<base>/own/tests``)."""
        return self.base / "own" / path.strip("/")

    def make_own(self, paths: list[str]) -> None:
        """Create the spec's ``folders`` (mode 1777, like /tmp: whatever uid runs inside)."""
        for path in paths:
            folder = self.own(path)
            folder.mkdir(parents=True)
            os.chmod(folder, 0o1777)

    def make_shm(self, uid: int | None = None) -> Path:
        """``<base>/shm``: a host folder to show at /dev/shm where a runtime cannot give
        a sized tmpfs there; being in the base folder, it counts against the disk cap."""
        shm = self.base / "shm"
        shm.mkdir(exist_ok=True)
        os.chmod(shm, 0o1777)
        if uid is not None:
            os.chown(shm, uid, uid)
        return shm

    @property
    def empty(self) -> Path:
        """``<base>/empty``: the empty read-only folder bound over a spec's ``hide``
        paths by the runtimes that bind folders (apptainer, docker/podman)."""
        return self.base / "empty"

    def make_empty(self) -> Path:
        """Create ``empty`` (mode 0555: nobody, the sandbox's uid included, adds to it)."""
        self.empty.mkdir(exist_ok=True)
        os.chmod(self.empty, 0o555)
        return self.empty

    def write_files(self, spec: SandboxSpec, uid: int | None = None, gid: int | None = None) -> None:
        for name, text in spec.files.items():
            target = resolve_in_workspace(self.workspace, name)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            if uid is not None:
                chown_up_to(target, self.workspace, uid, gid)


def chown_up_to(path: Path, top: Path, uid: int, gid: int | None) -> None:
    """chown ``path`` and its parents below ``top`` (folders made for a file)."""
    gid = gid if gid is not None else -1
    while True:
        os.chown(path, uid, gid, follow_symlinks=False)
        if path == top or top not in path.parents:
            return
        path = path.parent
