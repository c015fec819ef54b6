"""A tiny repository with one bug, built here as a git bundle: the SWE handler's tests
use it (the bundled swe-mini suite has its own tests)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

FILES = {
    ".gitignore": "__pycache__/\n",
    "calc/__init__.py": "from calc.ops import add, mean\n",
    "calc/ops.py": "def add(a, b):\n    return a + b\n\n\n"
    "def mean(values):\n    return sum(values) / (len(values) - 1)\n",
    "tests/__init__.py": "",
    "tests/test_ops.py": "from calc import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n\n\n"
    "def test_add_negative():\n    assert add(-1, 1) == 0\n",
}
BUGGY = "    return sum(values) / (len(values) - 1)\n"
FIXED = "    return sum(values) / len(values)\n"
NEW_TESTS = "\n\ndef test_mean():\n    from calc import mean\n    assert mean([1, 2, 3]) == 2\n"
ISSUE = "mean() is wrong: `calc.mean([1, 2, 3])` returns 3.0, expected 2.0."


def _git(repo: Path, *args: str, stdin: str | None = None) -> str:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
        "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
        "PATH": "/usr/bin:/bin",
    }
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env, input=stdin
    ).stdout


def build(folder: Path, instance_id: str = "toy__calc-1") -> dict:
    """Write ``<folder>/<instance_id>.bundle``; return the SWE-bench instance."""
    repo = folder / "repo"
    repo.mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    for path, text in FILES.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "calc")
    base = _git(repo, "rev-parse", "HEAD").strip()
    _git(repo, "bundle", "create", "-q", str(folder / f"{instance_id}.bundle"), "main")
    ops = repo / "calc/ops.py"
    ops.write_text(ops.read_text().replace(BUGGY, FIXED))
    gold = _git(repo, "diff")
    _git(repo, "checkout", "-q", "--", ".")
    tests = repo / "tests/test_ops.py"
    tests.write_text(tests.read_text() + NEW_TESTS)
    test_patch = _git(repo, "diff")
    _git(repo, "checkout", "-q", "--", ".")
    return {
        "instance_id": instance_id,
        "repo": "toy/calc",
        "base_commit": base,
        "problem_statement": ISSUE,
        "patch": gold,
        "test_patch": test_patch,
        "FAIL_TO_PASS": json.dumps(["tests/test_ops.py::test_mean"]),
        "PASS_TO_PASS": json.dumps(["tests/test_ops.py::test_add", "tests/test_ops.py::test_add_negative"]),
        "version": "0.1",
        "environment_setup_commit": base,
        "hints_text": "",
        "created_at": "2026-01-01T00:00:00Z",
    }
