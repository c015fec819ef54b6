"""The ``harbor`` family's server options and instances, and where a task's folder is.

An instance names a task folder on the server, inside the server's ``root`` (the
handler option; default: the bundled tasks): ``{"task": "hello-world"}`` (relative to
the root, or an absolute path under it), or an archive of one (``.tar``, ``.tar.gz``,
``.tgz``: its one top folder, or its root, is the task), unpacked once into a private
cache, a folder named by the archive's content (the same after a restart: reused, never
a new copy per start). A path that leads out of the root (``..``, a symlink) is refused, naming
``instance.task``. A dataset folder (a folder of task folders) is not one task: the
runner expands it into one row per task (``rollserve.datasets.harbor``: ``rollserve run
DIR``, ``datasets validate DIR``, ``datasets oracle DIR``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tarfile
import tempfile
import threading
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rollserve.handlers.base import InvalidInstance

BUNDLED = Path(__file__).resolve().parents[2] / "data" / "harbor"
ARCHIVES = (".tar", ".tar.gz", ".tgz")
MAX_ARCHIVE = 64 << 20


class HarborOptions(BaseModel):
    """``--handler-options '{"harbor": {...}}'``."""

    model_config = ConfigDict(extra="forbid")

    root: Path = Field(BUNDLED, description="the folder task paths are resolved in; nothing outside it can be named")
    network: Literal["offline", "refuse"] = Field(
        "offline",
        description="tasks that ask for the network (Harbor's default, public): "
        "run them without it, saying so in the evaluation, or refuse them at submit",
    )
    host_images: list[str] = Field(
        default_factory=list,
        description="on bubblewrap: images "
        "(environment.docker_image) the host's system stands in for, "
        "declared by the operator; other images are refused",
    )
    operator_modes: bool = Field(
        False,
        description="allow instance.agent 'oracle' and 'none' (the oracle check's server only: never a trainer's)",
    )
    max_memory_mb: int = Field(8192, ge=64, description="the most environment.memory_mb honoured")
    max_storage_mb: int = Field(16384, ge=64, description="the most environment.storage_mb honoured")
    max_verifier_seconds: float = Field(900.0, gt=0, description="verifier.timeout_sec above this is refused")
    max_agent_seconds: float = Field(3600.0, gt=0, description="agent.timeout_sec above this is refused")


class HarborInstance(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task: str = Field(
        min_length=1, max_length=4096, description="a task folder (or an archive of one) under the server's harbor root"
    )
    agent: Literal["tools", "oracle", "none"] = Field(
        "tools",
        description="tools: rollserve's loop (bash, finish), or instance.harness; "
        "oracle (solution/solve.sh) and none (nothing runs): the operator's check only",
    )
    harness: dict[str, Any] | None = Field(None, description="an agent harness (as the swe family's instance.harness)")


def resolve_task(root: Path, name: str) -> Path:
    """The task folder ``name`` names under ``root`` (an archive unpacked); InvalidInstance
    naming instance.task when it leads out of the root or is no task."""
    try:
        return _resolve(root, name)
    except (OSError, ValueError) as error:  # a NUL byte, a name too long, a loop...
        if isinstance(error, InvalidInstance):
            raise
        raise InvalidInstance("instance.task", f"not a usable path: {error}") from None


def _resolve(root: Path, name: str) -> Path:
    base = root.resolve()
    candidate = Path(name)
    path = (candidate if candidate.is_absolute() else base / candidate).resolve()
    if not path.is_relative_to(base):
        raise InvalidInstance("instance.task", "leads out of the server's harbor root")
    if not path.exists():
        raise InvalidInstance("instance.task", f"no such task under the server's harbor root: {name}")
    if path.is_file() and path.name.endswith(ARCHIVES):
        return unpack(path)
    if (
        path.is_dir()
        and not (path / "task.toml").exists()
        and any((child / "task.toml").is_file() for child in path.iterdir() if child.is_dir())
    ):
        raise InvalidInstance(
            "instance.task",
            "a dataset folder (a folder of tasks): submit one "
            "task per folder (rollserve datasets oracle DIR runs them all)",
        )
    return path


_UNPACKED: dict[tuple[str, int, int, int], Path] = {}  # by (path, mtime, size, inode)
_LOCK = threading.Lock()
_CACHE = Path(tempfile.gettempdir()) / "rollserve-harbor-archives"
MAX_REMEMBERED = 4096


def unpack(archive: Path) -> Path:
    """The task folder in ``archive``, unpacked once (by content) into a private cache:
    plain files and folders only (tarfile's ``data`` filter: no links, devices, absolute
    paths or paths out of the folder). An archive seen before, unchanged (its path,
    mtime, size and inode), is neither read nor hashed again."""
    info = archive.stat()
    if info.st_size > MAX_ARCHIVE:
        raise InvalidInstance("instance.task", f"archive over {MAX_ARCHIVE >> 20} MiB")
    key = (str(archive), info.st_mtime_ns, info.st_size, info.st_ino)
    with _LOCK:
        folder = _UNPACKED.get(key)
        if folder is None or not folder.is_dir():
            digest = hashlib.sha256(archive.read_bytes()).hexdigest()[:32]
            folder = _extract(archive, digest)
            if len(_UNPACKED) >= MAX_REMEMBERED:
                _UNPACKED.clear()
            _UNPACKED[key] = folder
    children = [c for c in folder.iterdir()]
    if not (folder / "task.toml").exists() and len(children) == 1 and children[0].is_dir():
        return children[0]
    return folder


def _extract(archive: Path, digest: str) -> Path:
    """The folder named by the archive's digest in the cache, the same across restarts
    (so the cache holds one copy per archive content, never one per start); unpacked into
    a temporary sibling and renamed into place, so a folder by that name is whole."""
    _CACHE.mkdir(mode=0o700, exist_ok=True)
    cache = _CACHE.lstat()  # its names are known: a cache another user can write is refused
    if not stat.S_ISDIR(cache.st_mode) or cache.st_uid != os.getuid() or cache.st_mode & 0o077:
        raise InvalidInstance(
            "instance.task",
            f"the server's archive cache {_CACHE} is not a folder private to it; the operator must remove it",
        )
    final = _CACHE / digest
    if final.is_dir():
        return final
    target = Path(tempfile.mkdtemp(prefix=f"{digest}.part-", dir=_CACHE))
    try:
        with tarfile.open(archive) as tar:
            members = tar.getmembers()
            for member in members:
                if not (member.isfile() or member.isdir()):
                    raise InvalidInstance(
                        "instance.task", f"archive member {member.name!r}: only plain files and folders"
                    )
            if sum(m.size for m in members) > 4 * MAX_ARCHIVE:
                raise InvalidInstance("instance.task", "archive unpacks too large")
            tar.extractall(target, filter="data")
        target.rename(final)
    except (tarfile.TarError, OSError) as error:
        if final.is_dir():  # another server on this host unpacked the same archive first
            return final
        raise InvalidInstance("instance.task", f"cannot unpack the archive: {error}") from None
    finally:
        shutil.rmtree(target, ignore_errors=True)  # (gone once renamed)
    return final


def cache_folder() -> Path:
    """Where archives are unpacked (hidden from sandboxes)."""
    return _CACHE
