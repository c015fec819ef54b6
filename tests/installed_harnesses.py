"""The one way tests find a real harness (Codex, Claude Code, ...): installed by
``rollserve harness install NAME`` under the install root (``$ROLLSERVE_HARNESS_DIR``,
else ``~/.cache/rollserve/harnesses``), checked as the server checks it at submit.

    pytestmark = needs_harness("codex")
    ...
    service, client = await make_api([llm.url], server={"harness_dir": harness_root()})

A test that needs one it cannot find is skipped, saying what to install.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rollserve.agent.harnesses.install import available, install_root, installed_problem


def harness_root() -> Path:
    """The install root the tests (and the server they start) use."""
    return install_root()


def harness_problem(name: str) -> str | None:
    """Why the preset ``name`` cannot run here (with what to install), or None."""
    root = harness_root()
    found = available(root)
    if name not in found:
        return f"no preset {name!r} in this rollserve"
    return installed_problem(found[name], root)


def needs_harness(name: str) -> pytest.MarkDecorator:
    """Skip unless ``name`` is installed and its Node fits."""
    problem = harness_problem(name)
    return pytest.mark.skipif(problem is not None, reason=f"harness {name}: {problem}")
