"""Which names a ``SandboxSpec.files`` mapping may use, checked before any sandbox starts.

A sandbox writes its spec's files into its workspace when it starts; a name it cannot
write there fails that start, which masks the rollout as an infrastructure failure
(and costs a sandbox) for what is bad input. ``workspace_file_problem`` finds such a
name first, so a request can be refused naming it:

- a path inside the workspace: relative, or absolute under ``/workspace``; no empty,
  ``.`` or ``..`` part (so no leading, trailing or doubled ``/``) and no NUL byte;
- each part at most ``MAX_PART_BYTES`` bytes of UTF-8 (the file systems' NAME_MAX), at
  most ``MAX_PATH_BYTES`` bytes and ``MAX_DEPTH`` parts in all (a path thousands of
  folders deep is made one recursion per folder);
- one file per path: not two names for the same file (``a`` and ``/workspace/a``),
  and no file that is also another file's folder (``a`` and ``a/b``).
"""

from __future__ import annotations

from collections.abc import Iterable

from rollserve.sandbox.base import WORKDIR

__all__ = ["MAX_DEPTH", "MAX_PART_BYTES", "MAX_PATH_BYTES", "relative_parts", "workspace_file_problem"]

MAX_PART_BYTES = 255
MAX_PATH_BYTES = 1024
MAX_DEPTH = 32


def relative_parts(name: str) -> list[str]:
    """``name``'s parts below the workspace (``/workspace/a/b`` and ``a/b``: a, b)."""
    if name == WORKDIR:
        return [""]
    return name.removeprefix(WORKDIR + "/").split("/")


def _name_problem(name: str) -> str | None:
    if "\0" in name:
        return "a file name may not hold a NUL byte"
    if name.startswith("/") and not name.startswith(WORKDIR + "/"):
        return f"a path inside the workspace: relative, or under {WORKDIR}/"
    parts = relative_parts(name)
    if any(part in ("", ".", "..") for part in parts):
        return "a path to a file, without empty, '.' or '..' parts (no leading, trailing or doubled '/')"
    if any(len(part.encode("utf-8")) > MAX_PART_BYTES for part in parts):
        return f"each part of the path at most {MAX_PART_BYTES} bytes (UTF-8)"
    if len("/".join(parts).encode("utf-8")) > MAX_PATH_BYTES:
        return f"a path of at most {MAX_PATH_BYTES} bytes (UTF-8)"
    if len(parts) > MAX_DEPTH:
        return f"a path at most {MAX_DEPTH} folders deep"
    return None


def workspace_file_problem(names: Iterable[str]) -> tuple[str, str] | None:
    """The first of ``names`` a sandbox could not write as its own file, and why; None
    when every one can be."""
    files: dict[tuple[str, ...], str] = {}
    for name in names:
        problem = _name_problem(name)
        if problem is not None:
            return name, problem
        path = tuple(relative_parts(name))
        if path in files:
            return name, f"names the same file as {files[path]!r}"
        files[path] = name
    folders: dict[tuple[str, ...], str] = {}
    for path, name in files.items():
        for depth in range(1, len(path)):
            folders.setdefault(path[:depth], name)
    for path, name in files.items():
        if path in folders:
            return name, f"is a file, but {folders[path]!r} needs it to be a folder"
    return None
