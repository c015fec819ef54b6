"""Where the tests find a real harness installed: ``$ROLLSERVE_HARNESS_DIR/<preset>``
(default ``~/.cache/rollserve/harnesses/<preset>``, where ``rollserve harness install``
puts it), its executable under ``node_modules/.bin``. A test that runs one skips,
saying what to install, where it is not."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

DEFAULT_ROOT = Path.home() / ".cache" / "rollserve" / "harnesses"


def harness_root() -> Path:
    return Path(os.environ.get("ROLLSERVE_HARNESS_DIR") or DEFAULT_ROOT)


def harness_bin(preset: str, executable: str) -> Path:
    """The installed executable of ``preset``, or a skip naming what to install."""
    path = harness_root() / preset / "node_modules" / ".bin" / executable
    if not os.access(path, os.X_OK):
        pytest.skip(f"{preset} is not installed at {path} (rollserve harness install {preset}, "
                    f"or ROLLSERVE_HARNESS_DIR=<the folder holding {preset}/node_modules>)")
    return path
