"""A Harbor task folder, read and checked (the layout as Harbor's ``TaskPaths`` has it):
``instruction.md``, ``task.toml``, ``environment/`` (a Dockerfile, or files),
``solution/solve.sh`` (the oracle's), ``tests/test.sh`` (the verifier's).

Refused, naming the problem (``TaskProblem``): a missing file, a ``task.toml`` that does
not parse or fit the schema, an unknown ``schema_version``, multi-step tasks
(``steps/``), prior context (``trajectory.json``), a symlink or anything but plain
files and folders (a path that could lead out of the task folder), a folder past the
size bound. ``tar_of`` packs a subfolder (tests, solution, environment files) for the
sandbox, as plain files only.
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
import threading
import tomllib
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from rollserve.contract.validation import field_name
from rollserve.handlers.harbor.config import TaskConfig
from rollserve.handlers.harbor.dockerfile import DockerfileProblem, HostPlan, host_plan

MAX_FILES = 5000
MAX_BYTES = 64 << 20
MAX_INSTRUCTION = 256 << 10
DOCKERFILE = "environment/Dockerfile"
COMPOSE = (
    "environment/docker-compose.yaml",
    "environment/docker-compose.yml",
    "environment/compose.yaml",
    "environment/singularity-compose.yaml",
)


class TaskProblem(ValueError):
    """Why a folder is not a task this server can run; ``where`` names the file or field."""

    def __init__(self, where: str, message: str):
        super().__init__(f"{where}: {message}")
        self.where = where
        self.message = message


@dataclass(frozen=True)
class HarborTask:
    folder: Path  # resolved
    instruction: str
    config: TaskConfig
    dockerfile: str | None  # its text, where there is one
    has_solution: bool

    @property
    def name(self) -> str:
        named = (self.config.task or {}).get("name")
        return str(named) if named else self.folder.name

    def host_plan(self) -> HostPlan:
        """The environment on the host's system (bubblewrap); TaskProblem if it cannot be."""
        if self.dockerfile is None:
            return HostPlan(
                copies=[(".", (self.config.environment.workdir or "/workspace") + "/")],
                workdir=self.config.environment.workdir,
            )
        try:
            return host_plan(self.dockerfile, self.config.environment.workdir)
        except DockerfileProblem as error:
            raise TaskProblem(DOCKERFILE, str(error).removeprefix(DOCKERFILE + " ")) from None


_LOADED: dict[Path, tuple[tuple[tuple[int, int, int] | None, ...], HarborTask]] = {}
_LOADED_LOCK = threading.Lock()
MAX_LOADED = 4096
# What load_task reads or lists, by stat: a change to one of them loads the task again.
WATCHED = (
    ".",
    "task.toml",
    "instruction.md",
    "environment",
    DOCKERFILE,
    "tests",
    "tests/test.sh",
    "solution",
    "solution/solve.sh",
    "steps",
    "trajectory.json",
    *COMPOSE,
)


def load_task_cached(folder: Path) -> HarborTask:
    """``load_task``, remembered by the folder and the stat (mtime, size, inode) of what
    it reads: a submit of a task already seen costs a few ``stat`` calls, not a walk of
    its files. (A change deeper in ``environment/``, ``tests/`` or ``solution/`` than
    these is not seen until one of them changes: ``tar_of`` packs plain files only
    whatever the walk saw.)"""
    key = tuple(_stat_key(folder / name) for name in WATCHED)
    with _LOADED_LOCK:
        known = _LOADED.get(folder)
    if known is not None and known[0] == key:
        return known[1]
    task = load_task(folder)
    with _LOADED_LOCK:
        if len(_LOADED) >= MAX_LOADED:
            _LOADED.clear()
        _LOADED[folder] = (key, task)
    return task


def _stat_key(path: Path) -> tuple[int, int, int] | None:
    try:
        info = path.lstat()
    except OSError:
        return None
    return info.st_mtime_ns, info.st_size, info.st_ino


def load_task(folder: Path) -> HarborTask:
    """The task in ``folder`` (already resolved inside the server's root)."""
    if not folder.is_dir():
        raise TaskProblem("task", f"{folder.name}: not a task folder")
    check_tree(folder)
    for required in ("task.toml", "instruction.md", "tests/test.sh"):
        if not (folder / required).is_file():
            also = (
                " (tests/test.bat: Windows tasks are not supported)"
                if required == "tests/test.sh" and (folder / "tests/test.bat").is_file()
                else ""
            )
            raise TaskProblem(required, "missing" + also)
    for refused, why in (
        ("steps", "multi-step tasks are not supported"),
        ("trajectory.json", "prior agent context is not supported"),
        *((c, "compose environments are not supported") for c in COMPOSE),
    ):
        if (folder / refused).exists():
            raise TaskProblem(refused, why)
    config = read_config(folder / "task.toml")
    instruction = (folder / "instruction.md").read_bytes()
    if len(instruction) > MAX_INSTRUCTION:
        raise TaskProblem("instruction.md", f"over {MAX_INSTRUCTION >> 10} KiB")
    dockerfile = folder / DOCKERFILE
    return HarborTask(
        folder,
        instruction.decode("utf-8", "replace"),
        config,
        dockerfile.read_text("utf-8", "replace") if dockerfile.is_file() else None,
        (folder / "solution/solve.sh").is_file(),
    )


def read_config(path: Path) -> TaskConfig:
    try:
        data = tomllib.loads(path.read_text("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise TaskProblem("task.toml", f"not valid TOML: {error}") from None
    try:
        return TaskConfig.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        where = field_name(first["loc"], empty="task.toml")
        raise TaskProblem(f"task.toml: {where}", first["msg"]) from None


def check_tree(folder: Path) -> None:
    """Only plain files and folders, within the bounds: a symlink (which could lead out
    of the task folder), a device or a fifo is refused, naming its path."""
    count = size = 0
    for top, dirs, files in os.walk(folder, followlinks=False):
        for name in dirs + files:
            path = Path(top) / name
            info = path.lstat()
            relative = path.relative_to(folder).as_posix()
            if stat.S_ISLNK(info.st_mode):
                raise TaskProblem(
                    relative, "a symlink: task folders hold plain files only (a link could lead out of the task folder)"
                )
            if not (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)):
                raise TaskProblem(relative, "not a plain file or folder")
            count += 1
            size += info.st_size if stat.S_ISREG(info.st_mode) else 0
    if count > MAX_FILES or size > MAX_BYTES:
        raise TaskProblem("task", f"over {MAX_FILES} files or {MAX_BYTES >> 20} MiB")


def tar_of(pairs: list[tuple[Path, str]]) -> bytes:
    """A tar of each (host path, name in the archive): a file, or a folder's whole tree
    (plain files and folders only, modes kept, owner dropped)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for source, name in pairs:
            _add(tar, source, name.strip("/") or ".")
    return buffer.getvalue()


def _add(tar: tarfile.TarFile, source: Path, name: str) -> None:
    info = source.lstat()
    if stat.S_ISDIR(info.st_mode):
        if name != ".":
            tar.addfile(_entry(name, tarfile.DIRTYPE, 0o755))
        for child in sorted(source.iterdir()):
            _add(tar, child, f"{name}/{child.name}" if name != "." else child.name)
    elif stat.S_ISREG(info.st_mode):
        entry = _entry(name, tarfile.REGTYPE, 0o755 if info.st_mode & 0o111 else 0o644)
        entry.size = info.st_size
        with source.open("rb") as data:
            tar.addfile(entry, data)
    else:
        raise TaskProblem(name, "not a plain file or folder")


def _entry(name: str, kind: bytes, mode: int) -> tarfile.TarInfo:
    entry = tarfile.TarInfo(name)
    entry.type, entry.mode = kind, mode
    return entry
