"""A file editor on a sandbox's workspace: view, create, str_replace, insert, undo.

It works host-side on the workspace folder (every runtime binds one at /workspace),
so an edit costs a file write, not a process in the sandbox, and behaves the same on
bubblewrap, apptainer, docker or local. Paths are what the agent sees inside
(``/workspace/src/a.py`` or ``src/a.py``) and never leave the workspace: no ``..``,
no absolute path elsewhere, no symlink that points out (checked on the resolved path).

Errors are ``EditorError`` with a message meant for the model (what went wrong and
how to fix the call); the tool layer shows it as the tool's answer.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from pydantic import BaseModel, ConfigDict, Field

from rollserve.sandbox.base import WORKDIR, resolve_in_workspace
from rollserve.sandbox.tools.text import truncate_middle


class EditorError(ValueError):
    """A call the editor refuses; the message tells the model why."""


class EditorConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_view_chars: int = Field(16_000, ge=100, description="longer views keep head and tail")
    max_file_bytes: int = Field(4 << 20, ge=1, description="refuse to load larger files")
    history_depth: int = Field(20, ge=1, description="undo steps kept per file")
    list_depth: int = Field(2, ge=1, description="levels shown when viewing a folder")
    max_list_entries: int = Field(400, ge=1)
    snippet_lines: int = Field(4, ge=0, description="context lines shown around an edit")


_MISSING = None  # history entry: the file did not exist before (undo deletes it)


class FileEditor:
    """Edits files under one workspace folder; keeps a per-file undo history."""

    def __init__(self, workspace: Path, config: EditorConfig | None = None):
        self.workspace = Path(workspace)
        self.config = config or EditorConfig()
        self._history: dict[Path, list[str | None]] = {}

    # --- paths ------------------------------------------------------------------
    def resolve(self, path: str) -> tuple[Path, str]:
        """Host path and display path (``/workspace/...``) for an agent's path."""
        if not isinstance(path, str) or not path.strip():
            raise EditorError("path is required (e.g. /workspace/main.py)")
        pure = PurePosixPath(path.strip())
        if ".." in pure.parts:
            raise EditorError(f"{path}: '..' is not allowed; give a path inside {WORKDIR}")
        if pure.is_absolute():
            # Compare whole components: /workspacefoo is not inside /workspace.
            if pure.parts[: len(PurePosixPath(WORKDIR).parts)] != PurePosixPath(WORKDIR).parts:
                raise EditorError(f"{path}: only paths inside {WORKDIR} can be edited")
            relative = PurePosixPath(*pure.parts[len(PurePosixPath(WORKDIR).parts) :])
        else:
            relative = pure
        try:
            host = resolve_in_workspace(self.workspace, str(relative))
        except PermissionError:
            raise EditorError(f"{path}: a symlink on this path leads outside {WORKDIR}") from None
        shown = str(PurePosixPath(WORKDIR) / host.relative_to(self.workspace.resolve()))
        return host, shown

    # --- commands -------------------------------------------------------------------
    def view(self, path: str, view_range: list[int] | None = None) -> str:
        host, shown = self.resolve(path)
        if host.is_dir():
            if view_range:
                raise EditorError(f"{shown} is a folder; view_range applies to files only")
            return self._list_folder(host, shown)
        lines = self._read(host, shown).split("\n")
        if lines and lines[-1] == "":  # a final newline ends the last line; no empty line after it
            lines.pop()
        start, end = 1, len(lines)
        if view_range:
            start, end = self._check_range(view_range, len(lines), shown)
        numbered = "\n".join(f"{n:6}\t{lines[n - 1]}" for n in range(start, end + 1))
        text, _ = truncate_middle(numbered, self.config.max_view_chars)
        what = f"lines {start}-{end} of {len(lines)}" if view_range else f"{len(lines)} lines"
        return f"{shown} ({what}):\n{text}"

    def create(self, path: str, file_text: str) -> str:
        host, shown = self.resolve(path)
        if host.is_dir():
            raise EditorError(f"{shown} is a folder")
        if host.exists():
            raise EditorError(
                f"{shown} already exists; use str_replace or insert to change it (create only makes new files)"
            )
        self._remember(host, _MISSING)
        made = [p for p in reversed(host.parents) if not p.exists()]
        host.parent.mkdir(parents=True, exist_ok=True)
        host.write_text(file_text, encoding="utf-8")
        self._give_to_sandbox([*made, host])
        return f"Created {shown} ({len(file_text.splitlines())} lines)."

    def str_replace(self, path: str, old_str: str, new_str: str = "") -> str:
        host, shown = self.resolve(path)
        if not old_str:
            raise EditorError("old_str must not be empty (to add text, use insert)")
        if old_str == new_str:
            raise EditorError("old_str and new_str are the same; nothing would change")
        text = self._read(host, shown)
        count = text.count(old_str)
        if count == 0:
            raise EditorError(self._no_match_message(text, old_str, shown))
        if count > 1:
            lines = _match_lines(text, old_str)
            raise EditorError(
                f"old_str occurs {count} times in {shown} (starting on lines "
                f"{', '.join(map(str, lines))}); include more surrounding lines so it "
                "matches exactly once. No change was made."
            )
        start_line = text[: text.index(old_str)].count("\n") + 1
        self._remember(host, text)
        new_text = text.replace(old_str, new_str, 1)
        host.write_text(new_text, encoding="utf-8")
        end_line = start_line + new_str.count("\n")
        return f"Edited {shown}.\n" + self._snippet(new_text, start_line, end_line)

    def insert(self, path: str, insert_line: int, new_str: str) -> str:
        host, shown = self.resolve(path)
        if not isinstance(insert_line, int) or isinstance(insert_line, bool):
            raise EditorError("insert_line must be an integer (0 inserts at the top)")
        text = self._read(host, shown)
        lines = text.splitlines(keepends=True)
        if not 0 <= insert_line <= len(lines):
            raise EditorError(
                f"insert_line {insert_line} is out of range: {shown} has {len(lines)} lines "
                f"(use 0 to insert at the top, {len(lines)} to append)"
            )
        block = new_str if new_str.endswith("\n") else new_str + "\n"
        before = "".join(lines[:insert_line])
        if before and not before.endswith("\n"):  # appending after a last line with no newline
            before += "\n"
        new_text = before + block + "".join(lines[insert_line:])
        self._remember(host, text)
        host.write_text(new_text, encoding="utf-8")
        first = insert_line + 1
        return f"Inserted {block.count(chr(10))} lines into {shown} after line {insert_line}.\n" + self._snippet(
            new_text, first, first + block.count("\n") - 1
        )

    def undo(self, path: str) -> str:
        host, shown = self.resolve(path)
        history = self._history.get(host)
        if not history:
            raise EditorError(f"no edit of {shown} to undo")
        previous = history.pop()
        if previous is _MISSING:
            host.unlink(missing_ok=True)
            return f"Undid the creation of {shown} (file removed)."
        host.write_text(previous, encoding="utf-8")
        self._give_to_sandbox([host])  # (recreated, if it was deleted meanwhile)
        return f"Undid the last edit of {shown}; {len(history)} earlier edits can still be undone."

    # --- helpers ----------------------------------------------------------------------
    def _read(self, host: Path, shown: str) -> str:
        if not host.exists():
            raise EditorError(f"{shown} does not exist (use create to make it)")
        if host.is_dir():
            raise EditorError(f"{shown} is a folder, not a file")
        if not host.is_file():  # a FIFO or device would block the read forever
            raise EditorError(f"{shown} is not a regular file")
        size = host.stat().st_size
        if size > self.config.max_file_bytes:
            raise EditorError(
                f"{shown} is {size} bytes, over the editor's limit of "
                f"{self.config.max_file_bytes}; use bash (head, sed -n) to read parts of it"
            )
        data = host.read_bytes()
        if b"\x00" in data[:8192]:
            raise EditorError(f"{shown} looks binary; the editor handles text files only")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise EditorError(f"{shown} is not UTF-8 text; the editor handles UTF-8 only") from None

    def _give_to_sandbox(self, paths: list[Path]) -> None:
        """New files and folders belong to whoever owns the workspace. A server running
        as root writes as root, but the sandbox may run as another uid (bubblewrap
        drops root to "nobody"); without this the agent could not change its own file.
        Edits of existing files keep their inode, hence their owner and mode."""
        if os.geteuid() != 0:
            return
        owner = self.workspace.stat()
        for path in paths:
            if path.exists() and path.stat().st_uid != owner.st_uid:
                os.chown(path, owner.st_uid, owner.st_gid, follow_symlinks=False)

    def _remember(self, host: Path, previous: str | None) -> None:
        history = self._history.setdefault(host, [])
        history.append(previous)
        del history[: -self.config.history_depth]

    def _check_range(self, view_range: list[int], n_lines: int, shown: str) -> tuple[int, int]:
        if (
            not isinstance(view_range, (list, tuple))
            or len(view_range) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in view_range)
        ):
            raise EditorError("view_range must be two integers [start, end] (end -1: to the end)")
        start, end = view_range
        end = n_lines if end == -1 else end
        if not 1 <= start <= max(n_lines, 1):
            raise EditorError(f"view_range start {start} is out of range: {shown} has {n_lines} lines")
        if end < start or end > n_lines:
            raise EditorError(
                f"view_range end {view_range[1]} is out of range: it must be between "
                f"{start} and {n_lines} (or -1 for the end of the file)"
            )
        return start, end

    def _list_folder(self, host: Path, shown: str) -> str:
        entries: list[str] = []
        skipped = 0

        def walk(folder: Path, depth: int) -> None:
            nonlocal skipped
            try:
                children = sorted(folder.iterdir(), key=lambda p: p.name)
            except OSError:
                return
            for child in children:
                if child.name.startswith("."):
                    continue  # .git and friends would drown the listing
                if len(entries) >= self.config.max_list_entries:
                    skipped += 1
                    continue
                rel = child.relative_to(host)
                is_dir = child.is_dir() and not child.is_symlink()
                entries.append(f"{shown.rstrip('/')}/{rel}{'/' if is_dir else ''}")
                if is_dir and depth < self.config.list_depth:
                    walk(child, depth + 1)

        walk(host, 1)
        body = "\n".join(entries) if entries else "(empty)"
        more = f"\n[... {skipped} more entries not shown ...]" if skipped else ""
        return (
            f"Files and folders in {shown}, {self.config.list_depth} levels deep (hidden ones not shown):\n{body}{more}"
        )

    def _no_match_message(self, text: str, old_str: str, shown: str) -> str:
        message = f"old_str was not found verbatim in {shown}. No change was made."
        # The usual cause is whitespace (indentation, trailing spaces, tabs): say so.
        squeezed = [line.strip() for line in old_str.strip().splitlines() if line.strip()]
        if squeezed:
            first = squeezed[0]
            near = [n for n, line in enumerate(text.splitlines(), 1) if first in line]
            if near:
                message += (
                    f" Its first line appears (ignoring surrounding whitespace) on line(s) "
                    f"{', '.join(map(str, near[:10]))}: check the indentation and whitespace, "
                    "or view those lines and copy them exactly."
                )
        return message

    def _snippet(self, text: str, first: int, last: int) -> str:
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        lo = max(1, first - self.config.snippet_lines)
        hi = min(len(lines), max(first, last) + self.config.snippet_lines)
        body = "\n".join(f"{n:6}\t{lines[n - 1]}" for n in range(lo, hi + 1))
        snippet, _ = truncate_middle(body, self.config.max_view_chars)
        return f"Lines {lo}-{hi} now:\n{snippet}"


def _match_lines(text: str, needle: str) -> list[int]:
    """1-based line numbers where each (possibly overlapping) occurrence starts."""
    lines, start = [], 0
    while (index := text.find(needle, start)) != -1:
        lines.append(text.count("\n", 0, index) + 1)
        start = index + 1
    return lines[:20]
