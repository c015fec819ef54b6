"""Where tests find a real harness CLI (installed by ``rollserve harness install NAME``,
or by hand with ``npm install --prefix <root>/<name> <package>``).

The install root is ``$ROLLSERVE_HARNESS_DIR``, else ``~/.cache/rollserve/harnesses``
(the server's default); a harness ``name``'s executable ``bin`` is
``<root>/<name>/node_modules/.bin/<bin>``. A test that needs one skips, saying where it
looked, when it is not there.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

__all__ = ["harness_bin", "harness_root"]


def harness_root() -> Path:
    return Path(os.environ.get("ROLLSERVE_HARNESS_DIR") or "~/.cache/rollserve/harnesses"
                ).expanduser()


def harness_bin(name: str, bin_name: str | None = None) -> Path:
    """The installed executable of harness ``name`` (``bin_name``, default ``name``);
    skips the calling test when it is not installed."""
    path = harness_root() / name / "node_modules" / ".bin" / (bin_name or name)
    if not os.access(path, os.X_OK):
        pytest.skip(f"{name} is not installed at {path} (rollserve harness install {name}, "
                    "or set ROLLSERVE_HARNESS_DIR to the install root)")
    return path
