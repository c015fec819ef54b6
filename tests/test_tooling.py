"""Lint and types of ``src/``: ``ruff check src`` and ``mypy`` (its configured ``files``),
as pyproject.toml configures them, must report nothing. CI runs them with the rest of
the suite; the findings are printed when they fail."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``python -m <args>`` in the repository root (pyproject.toml's settings apply)."""
    try:
        return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True,
                              text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(args)} took more than {timeout:g} s:\n{exc.stdout or ''}{exc.stderr or ''}")


def test_ruff_reports_nothing_on_src() -> None:
    # Lint (pycodestyle, pyflakes, bugbear, pyupgrade) and import order: under a second.
    done = _run("ruff", "check", "--no-cache", "src", timeout=120)
    assert done.returncode == 0, f"ruff check src:\n{done.stdout}{done.stderr}"


@pytest.mark.timeout(660)
def test_mypy_reports_nothing_on_src() -> None:
    # Cold (no .mypy_cache) about 60-90 s on a 2-core machine; seconds once cached.
    done = _run("mypy", timeout=600)
    assert done.returncode == 0, f"mypy:\n{done.stdout}{done.stderr}"
