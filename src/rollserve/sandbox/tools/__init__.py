"""Tools that act inside a sandbox: a bash shell on a PTY, an IPython kernel on
pipes, and a file editor on the workspace. Each works on any runtime."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rollserve.faces import lazy_names

if TYPE_CHECKING:
    from rollserve.sandbox.tools.bash import (
        DEFAULT_ENV,
        BashBusy,
        BashConfig,
        BashResult,
        BashSession,
    )
    from rollserve.sandbox.tools.editor import EditorConfig, EditorError, FileEditor
    from rollserve.sandbox.tools.ipython import IPythonConfig, IPythonSession
    from rollserve.sandbox.tools.keys import is_key_sequence
    from rollserve.sandbox.tools.text import truncate_middle

_HOMES: dict[str, str] = {
    **dict.fromkeys(
        ("BashBusy", "BashConfig", "BashResult", "BashSession", "DEFAULT_ENV"), "rollserve.sandbox.tools.bash"
    ),
    **dict.fromkeys(("EditorConfig", "EditorError", "FileEditor"), "rollserve.sandbox.tools.editor"),
    **dict.fromkeys(("IPythonConfig", "IPythonSession"), "rollserve.sandbox.tools.ipython"),
    "is_key_sequence": "rollserve.sandbox.tools.keys",
    "truncate_middle": "rollserve.sandbox.tools.text",
}
__all__ = [  # (the keys of _HOMES, written out for tools that read __all__)
    "BashBusy",
    "BashConfig",
    "BashResult",
    "BashSession",
    "DEFAULT_ENV",
    "EditorConfig",
    "EditorError",
    "FileEditor",
    "IPythonConfig",
    "IPythonSession",
    "is_key_sequence",
    "truncate_middle",
]


if not TYPE_CHECKING:  # hidden from the type checker: a misspelled import is an error
    __getattr__, __dir__ = lazy_names(__name__, _HOMES, globals())
