"""The sandbox tools (bash, python, file editor) as agent tools: schema + call.

Each wraps one sandbox-side tool and turns its result into the text the model reads.
They open their session lazily on the first call, so an episode that never uses a
tool never starts its shell or kernel; ``close()`` ends what was opened.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from rollserve.agent.tools import Tool, ToolError, function_schema
from rollserve.sandbox.base import Sandbox
from rollserve.sandbox.tools import (
    BashBusy,
    BashConfig,
    BashResult,
    BashSession,
    EditorConfig,
    EditorError,
    FileEditor,
    IPythonConfig,
    IPythonSession,
    is_key_sequence,
)


class BashTool(Tool):
    """``bash``: a persistent shell; ``is_input`` answers a command that is waiting."""

    def __init__(self, sandbox: Sandbox, config: BashConfig | None = None, max_timeout: float = 600.0) -> None:
        self.session = BashSession(sandbox, config)
        self.max_timeout = max_timeout
        self.schema = function_schema(
            "bash",
            "Run a bash command in a persistent shell in /workspace: the working folder, "
            "variables and background jobs persist between calls. Long-running commands "
            "are stopped at the timeout; put servers in the background (cmd > log 2>&1 &). "
            "A command that waits for input (a prompt) returns while still running: answer "
            "it with is_input=true (a new command instead stops it).",
            {
                "command": {
                    "type": "string",
                    "description": "the command (several lines allowed). With is_input=true: "
                    "text to type into the running program (Enter is added), or keys such as "
                    "C-c, C-d, Enter; an empty string just waits for more output",
                },
                "is_input": {
                    "type": "boolean",
                    "description": "send 'command' as input to the program still running "
                    "instead of starting a new command (default false)",
                },
                "timeout": {
                    "type": "number",
                    "description": f"seconds to allow (default {self.session.config.timeout:g}, "
                    f"at most {max_timeout:g}); when given, the command may also stay silent "
                    "that long (else it is stopped after a while without output)",
                },
            },
            ["command"],
        )

    async def __call__(self, args: dict[str, Any]) -> str:
        command = args["command"]
        timeout = args.get("timeout")
        if timeout is not None and not 0 < timeout <= self.max_timeout:
            raise ToolError(f"timeout must be between 0 and {self.max_timeout:g} seconds")
        if args.get("is_input"):
            if not self.session.running:
                raise ToolError(
                    "no command is running, so there is nothing to send input to; "
                    "call bash without is_input to run a command"
                )
            if not command:
                result = await self.session.send(timeout=timeout)  # only wait for output
            elif is_key_sequence(command):
                result = await self.session.send(keys=command.split(), timeout=timeout)
            else:
                result = await self.session.send(text=command + "\n", timeout=timeout)
            return self._text(result)
        if not command.strip():
            raise ToolError("command is empty")
        # An explicit timeout is the model saying "this is slow": no idle cut-off then.
        idle: Literal["default"] | None = None if timeout is not None else "default"
        try:
            result = await self.session.run(command, timeout=timeout, idle_timeout=idle)
        except BashBusy:
            # A new command while one still runs (it waits for input): stop that one
            # rather than refuse every later command (a format without is_input, such
            # as bash_block, could never get out).
            stopped = await self.session.interrupt()
            result = await self.session.run(command, timeout=timeout, idle_timeout=idle)
            how = "; ".join(stopped.notes)
            result.notes.insert(0, f"the previous command was still running and was stopped first ({how})")
        return self._text(result)

    @staticmethod
    def _text(result: BashResult) -> str:
        if result.waiting_for_input:
            result.notes.append(
                "answer it with is_input=true: the text to type, or keys such as "
                "C-c or C-d; or is_input=true with an empty command to wait"
            )
        elif result.running:
            result.notes.append(
                "it is still running: is_input=true sends it input or keys "
                "(C-c stops it); an empty command waits for more output; "
                "a new command stops it"
            )
        return result.to_text()

    async def close(self) -> None:
        await self.session.close()

    async def interrupt(self) -> None:
        """Stop the command a cancelled call left running: C-c, then SIGKILL to its
        process group (the shell stays)."""
        if self.session.running:
            await self.session.interrupt()


class PythonTool(Tool):
    """``python``: a persistent IPython kernel (ProRL's math tool)."""

    def __init__(self, sandbox: Sandbox, config: IPythonConfig | None = None) -> None:
        self.session = IPythonSession(sandbox, config)
        self.images: list[str] = []  # base64 PNGs of every cell, for handlers that keep them
        self.schema = function_schema(
            "python",
            "Run Python code in a persistent IPython session: variables, imports and "
            "functions persist between calls. The value of the last expression is shown; "
            "print() anything else you need to see.",
            {"code": {"type": "string", "description": "the Python code to run"}},
            ["code"],
        )

    async def __call__(self, args: dict[str, Any]) -> str:
        result = await self.session.run(args["code"])
        self.images += result.images
        return result.to_text()

    async def close(self) -> None:
        await self.session.close()

    async def interrupt(self) -> None:
        """A cell a cancelled call left running: the kernel is ended (the episode is
        over; a later call would start a new one)."""
        await self.session.close()


class EditorTool(Tool):
    """``str_replace_editor``: view/create/str_replace/insert/undo_edit (SWE-agent's names)."""

    COMMANDS = ["view", "create", "str_replace", "insert", "undo_edit"]

    def __init__(self, sandbox: Sandbox, config: EditorConfig | None = None) -> None:
        self.editor = FileEditor(sandbox.workspace, config)
        self.schema = function_schema(
            "str_replace_editor",
            "View, create and edit files in /workspace. view: a file with line numbers "
            "(optionally view_range [start, end]) or a folder's entries. create: a new file "
            "with file_text. str_replace: replace old_str, which must occur exactly once, "
            "with new_str. insert: new_str after line insert_line (0: at the top). "
            "undo_edit: revert the last edit of the file.",
            {
                "command": {"type": "string", "enum": self.COMMANDS},
                "path": {"type": "string", "description": "file or folder, e.g. /workspace/main.py"},
                "file_text": {"type": "string"},
                "old_str": {"type": "string"},
                "new_str": {"type": "string"},
                "insert_line": {"type": "integer"},
                "view_range": {"type": "array", "items": {"type": "integer"}},
            },
            ["command", "path"],
        )

    async def __call__(self, args: dict[str, Any]) -> str:
        command, path = args["command"], args["path"]
        needs = {"create": ["file_text"], "str_replace": ["old_str"], "insert": ["insert_line", "new_str"]}
        missing = [name for name in needs.get(command, []) if name not in args]
        if missing:
            raise ToolError(f"{command} needs {', '.join(missing)}")
        editor = self.editor
        calls = {
            "view": lambda: editor.view(path, args.get("view_range")),
            "create": lambda: editor.create(path, args["file_text"]),
            "str_replace": lambda: editor.str_replace(path, args["old_str"], args.get("new_str", "")),
            "insert": lambda: editor.insert(path, args["insert_line"], args["new_str"]),
            "undo_edit": lambda: editor.undo(path),
        }
        try:
            # In a thread: a workspace on a slow or network disk must not stall the loop.
            return await asyncio.to_thread(calls[command])
        except (EditorError, OSError) as exc:
            raise ToolError(str(exc)) from None
