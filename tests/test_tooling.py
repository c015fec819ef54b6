"""Lint of ``src/``, ``tests/`` and ``benchmarks/`` (``ruff check src tests benchmarks``, complexity included), their
format (``ruff format --check src tests``) and types of ``src/`` (``mypy``, its configured
``files``), as pyproject.toml configures them, must report nothing. CI runs them with the
rest of the suite; the findings are printed when they fail."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests import early_start

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``python -m <args>`` in the repository root (pyproject.toml's settings apply)."""
    try:
        return subprocess.run(
            [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(args)} took more than {timeout:g} s:\n{exc.stdout or ''}{exc.stderr or ''}")


def test_ruff_reports_nothing_on_src_tests_or_benchmarks() -> None:
    # Lint (pycodestyle, pyflakes, bugbear, pyupgrade, complexity at pyproject's C901
    # bound: a function over it is split into named steps) and import order, on the
    # source and the tests alike: about a second.
    done = _run("ruff", "check", "--no-cache", "src", "tests", "benchmarks", timeout=120)
    assert done.returncode == 0, f"ruff check src tests benchmarks:\n{done.stdout}{done.stderr}"


def test_ruff_format_would_change_nothing_in_src_or_tests() -> None:
    # pyproject's [tool.ruff.format] (line length 120, the bundled task data left as it
    # is); the tree was formatted in one commit, listed in .git-blame-ignore-revs.
    done = _run("ruff", "format", "--check", "--no-cache", "src", "tests", timeout=120)
    assert done.returncode == 0, (
        f"ruff format --check src tests (run `ruff format src tests`):\n{done.stdout}{done.stderr}"
    )


@pytest.mark.timeout(660)
def test_mypy_reports_nothing_on_src(request: pytest.FixtureRequest) -> None:
    # Cold (no .mypy_cache) about 60-120 s on a 2-core machine; seconds once cached.
    # tests/conftest.py starts it when the session starts (tests/early_start.py), so it
    # runs while other tests wait; here it is collected, bounded from its start.
    early = early_start.started(request.node.nodeid)
    if early is None:
        done = _run("mypy", timeout=600)
    else:
        try:
            done = early.result(timeout=600)
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"mypy took more than 600 s:\n{exc.output or ''}")
    assert done.returncode == 0, f"mypy:\n{done.stdout}{done.stderr}"
