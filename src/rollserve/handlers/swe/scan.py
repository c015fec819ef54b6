"""The machinery scan (see ``machinery``) of a candidate patch, in EVAL's sandbox.

The changed Python files are read twice from the fresh sandbox: before the patch is
applied (what the environment holds: nothing the agent touched) and after (what the
tests will import, whichever of ``patch``'s fallbacks applied it). The repository's
own top-level packages are listed before too. A file this interpreter cannot parse
before the patch either (newer syntax) is scanned by its patch lines (``fragments``).
``SWEOptions.machinery``: "fail" (a
finding makes the candidate unresolved without running the tests), "flag" (graded
as usual, the findings listed), "off" (no scan).
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rollserve.handlers.swe import diffparse, fragments, machinery
from rollserve.handlers.swe.machinery import Finding
from rollserve.handlers.swe.patch import apply_patch
from rollserve.sandbox.base import Sandbox, resolve_in_workspace

Mode = Literal["fail", "flag", "off"]
MAX_FILE_BYTES = 16 << 20  # a larger .py file is a finding: not scanned
MAX_TREE_FILES = 300_000  # a larger repository's files are not compared before/after
SHOWN = 5  # findings named in the reason


@dataclass
class Pending:
    """What the scan read before the patch was applied."""

    mode: Mode
    files: list[tuple[str | None, str, str]]  # (path before or None: new, path after, its diff)
    before: dict[str, bytes | None] = field(default_factory=dict)  # by path before
    own: frozenset[str] = frozenset()
    named: frozenset[str] = frozenset()  # every path the patch's file headers name
    tree: dict[str, tuple[int, int, int]] | None = None  # path -> (size, mtime, inode)


@dataclass
class Verdict:
    mode: Mode
    findings: list[Finding] = field(default_factory=list)

    @property
    def fails(self) -> bool:
        return self.mode == "fail" and bool(self.findings)

    @property
    def reason(self) -> str:
        shown = "; ".join(f"{f.file}:{f.line}: {f.what}" for f in self.findings[:SHOWN])
        more = len(self.findings) - SHOWN
        return "the patch's code reaches into test machinery: " + shown + (f" (and {more} more)" if more > 0 else "")

    def details(self) -> dict[str, Any]:
        """For the evaluation: the mode and the findings (file, line, what)."""
        return {"machinery": self.mode, "machinery_findings": [f.as_dict() for f in self.findings]}


def python_files(patch: str) -> list[tuple[str | None, str, str]]:
    """(path before or None, path after, its diff) of each ``.py`` file the patch adds or
    changes (renames and copies: their source before); deleted files are left out."""
    files = []
    for parsed in diffparse.parse(patch)[1]:
        block, paths = parsed.text, parsed.paths
        if not paths:
            continue
        head = block.split("\n@@", 1)[0].split("\n")
        if any(line.startswith(("deleted file mode", "+++ /dev/null")) for line in head):
            continue
        after = paths[-1]
        if not after.endswith(".py"):
            continue
        new = any(line.startswith(("new file mode", "--- /dev/null")) for line in head)
        files.append((None if new else paths[0], after, block))
    return files


def _read(workspace: Path, path: str) -> bytes | None:
    """A workspace file's bytes; None if it is not there. Raises OSError/PermissionError
    for one that cannot be read (a link out of the workspace, a folder, too large)."""
    target = resolve_in_workspace(workspace, path)
    if not target.exists():
        return None
    if target.stat().st_size > MAX_FILE_BYTES:
        raise OSError(f"over {MAX_FILE_BYTES >> 20} MiB")
    return target.read_bytes()


def _own(workspace: Path) -> frozenset[str]:
    root = workspace.resolve()
    names = []
    for folder in ("", "src", "lib"):
        base = root / folder
        if not base.is_dir():
            continue
        for entry in os.scandir(base):
            prefix = f"{folder}/" if folder else ""
            if entry.is_dir(follow_symlinks=False) and (Path(entry.path) / "__init__.py").is_file():
                names.append(f"{prefix}{entry.name}/__init__.py")
            elif entry.name.endswith(".py"):
                names.append(f"{prefix}{entry.name}")
    return machinery.own_packages(names)


def _tree(workspace: Path) -> dict[str, tuple[int, int, int]] | None:
    """Every file under the workspace (its git folder aside): (size, mtime, inode)."""
    root = str(workspace.resolve())
    found: dict[str, tuple[int, int, int]] = {}
    for folder, dirs, files in os.walk(root):
        if folder == root:
            dirs[:] = [d for d in dirs if d != ".git"]
        for name in files:
            path = os.path.join(folder, name)
            try:
                stat = os.lstat(path)
            except OSError:
                continue
            found[os.path.relpath(path, root)] = (stat.st_size, stat.st_mtime_ns, stat.st_ino)
            if len(found) > MAX_TREE_FILES:
                return None
    return found


def smuggled(workspace: Path, pending: Pending) -> list[Finding]:
    """Files the applied patch made or changed that no file header of it names: a
    second ``---``/``+++`` pair after a hunk is a file of its own to ``git apply`` and
    ``patch``, unseen by a reading of the headers (a ``conftest.py`` passed that way).
    ``patch``'s backups of named files (``.orig``, ``.rej``) are not findings."""
    if pending.tree is None:
        return []
    after = _tree(workspace) or {}
    named = pending.named | {f"{p}{suffix}" for p in pending.named for suffix in (".orig", ".rej")}
    changed = sorted(
        path
        for path, stat in after.items()
        if pending.tree.get(path) != stat and path not in named and "__pycache__" not in path.split(os.sep)
    )
    return [
        Finding(
            path, 0, "changed by the patch, yet named in none of its file headers (a file passed by the checks unseen)"
        )
        for path in changed
    ]


def read_before(workspace: Path, patch: str, mode: Mode) -> Pending:
    named = {path for block in diffparse.parse(patch)[1] for path in block.paths}
    pending = Pending(mode, python_files(patch), own=_own(workspace), named=frozenset(named), tree=_tree(workspace))
    for before, _after, _block in pending.files:
        if before is not None:
            try:
                pending.before[before] = _read(workspace, before)
            except (OSError, ValueError):
                pending.before[before] = None
    return pending


def scan_after(workspace: Path, pending: Pending) -> Verdict:
    findings = smuggled(workspace, pending)
    for before, after, block in pending.files:
        try:
            text = _read(workspace, after)
        except (OSError, ValueError) as error:
            findings.append(Finding(after, 0, f"cannot be read after the patch: {error}"))
            continue
        if text is None:  # (git applied it elsewhere: a diff without a/ b/ prefixes)
            findings.append(Finding(after, 0, "named by the patch, yet not there once it is applied"))
            continue
        old = pending.before.get(before) if before is not None else None
        if old is not None and text is not None and not machinery.parses(old):
            findings += fragments.added(after, block, text, pending.own)  # newer syntax
        else:
            findings += machinery.added(after, old, text, pending.own)
    return Verdict(pending.mode, findings)


async def prepare(sandbox: Sandbox, patch: str, mode: Mode) -> Pending | None:
    """Before the patch is applied: the files it changes, as they are, and the
    repository's own packages (None when the scan is off)."""
    if mode == "off":
        return None
    return await asyncio.to_thread(read_before, sandbox.workspace, patch, mode)


async def finish(sandbox: Sandbox, pending: Pending | None) -> Verdict | None:
    """After the patch is applied: what its Python files added (None when off)."""
    if pending is None:
        return None
    return await asyncio.to_thread(scan_after, sandbox.workspace, pending)


async def apply_scanned(sandbox: Sandbox, patch: str, mode: Mode, outcome: dict[str, Any]) -> bool:
    """Apply a candidate's patch, scanned before and after: False (``outcome`` says why,
    the tests not to run) when it does not apply or the scan fails it."""
    pending = await prepare(sandbox, patch, mode)
    applied = await apply_patch(sandbox, patch)
    outcome.update(patch_applied=applied.ok, apply_command=applied.command)
    if not applied.ok:
        outcome.update(resolved=False, tests_ran=False, reason="the patch does not apply", apply_log=applied.log)
        return False
    verdict = await finish(sandbox, pending)
    if verdict is not None:
        outcome.update(verdict.details())
        if verdict.fails:
            outcome.update(resolved=False, tests_ran=False, reason=verdict.reason)
            return False
    return True
