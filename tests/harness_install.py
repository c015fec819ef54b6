"""The one way tests find a real harness CLI (Codex, Claude Code, ...): installed by
``rollserve harness install NAME`` (or by hand with ``npm install --prefix <root>/<name>
<package>``) under the install root, checked as the server checks it at submit.

The install root is ``$ROLLSERVE_HARNESS_DIR``, else ``~/.cache/rollserve/harnesses``
(the server's default); a harness ``name``'s executable ``bin`` is
``<root>/<name>/node_modules/.bin/<bin>``::

    pytestmark = needs_harness("codex")          # a test running it through a server
    ...
    service, client = await make_api([llm.url], server={"harness_dir": harness_root()})

    codex = harness_bin("codex")                 # a test running the executable itself

A test that needs one it cannot find is skipped, saying where it looked and what to install;
with ``ROLLSERVE_REQUIRE_HARNESSES=1`` (CI sets it once ``rollserve harness install``
installed them all) it fails instead, so a harness that went missing is never a quiet skip.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rollserve.agent.harnesses.install import available, install_root, installed_problem

__all__ = ["harness_bin", "harness_problem", "harness_root", "needs_harness"]

REQUIRED = os.environ.get("ROLLSERVE_REQUIRE_HARNESSES") == "1"


def _missing(reason: str) -> None:
    """Skip (or, where the harnesses are required, fail) for a harness not found."""
    if REQUIRED:
        pytest.fail(f"{reason} (ROLLSERVE_REQUIRE_HARNESSES=1: every harness must be installed)", pytrace=False)
    pytest.skip(reason)


def harness_root() -> Path:
    """The install root the tests (and the servers they start) use (absolute)."""
    return install_root()


def harness_bin(name: str, bin_name: str | None = None) -> Path:
    """The installed executable of harness ``name`` (``bin_name``, default ``name``);
    skips the calling test when it is not installed."""
    path = harness_root() / name / "node_modules" / ".bin" / (bin_name or name)
    if not os.access(path, os.X_OK):
        _missing(
            f"{name} is not installed at {path} (rollserve harness install {name}, "
            "or set ROLLSERVE_HARNESS_DIR to the install root)"
        )
    return path


def harness_problem(name: str) -> str | None:
    """Why the preset ``name`` cannot run here (with what to install), or None."""
    root = harness_root()
    found = available(root)
    if name not in found:
        return f"no preset {name!r} in this rollserve"
    return installed_problem(found[name], root)


def needs_harness(name: str) -> pytest.MarkDecorator:
    """Skip unless ``name`` is installed and its Node fits (as the server checks at submit);
    where the harnesses are required, the module fails to load instead."""
    problem = harness_problem(name)
    if problem is not None and REQUIRED:
        _missing(f"harness {name}: {problem}")
    return pytest.mark.skipif(problem is not None, reason=f"harness {name}: {problem}")
