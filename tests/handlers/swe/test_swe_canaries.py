"""Canaries (``canaries``): made from the graded module's own tests, written among them
as real source, and failing in a real pytest run exactly where their originals pass."""

from __future__ import annotations

import ast
import os
import random
import subprocess
import sys
from pathlib import Path

from rollserve.handlers.swe import canaries, results
from rollserve.handlers.swe.evaluate import RECORDS_FD

CODE = "def double(x):\n    return 2 * x\n\n\ndef is_even(n):\n    return n % 2 == 0\n"
TESTS = """import unittest

import pytest

from pkg import double, is_even


def test_double():
    assert double(2) == 4
    assert double(0) == 0


# comments stay with their test
def test_is_even():
    value = double(3)
    assert is_even(value)
    assert not is_even(3)


@pytest.mark.parametrize("n", [1, 2])
def test_double_param(n):
    assert double(n) == n + n


def test_returns_early():
    if double(1) == 2:
        return
    assert double(1) == 3


class TestNumbers:
    def test_method(self):
        assert double(5) == 10


class Cases(unittest.TestCase):
    def test_case(self):
        self.assertEqual(double(3), 6)
        self.assertTrue(is_even(4))
"""
F2P = [
    "tests/test_pkg.py::test_double",
    "tests/test_pkg.py::test_is_even",
    "tests/test_pkg.py::test_double_param[1]",
    "tests/test_pkg.py::TestNumbers::test_method",
    "tests/test_pkg.py::Cases::test_case",
    "tests/test_pkg.py::test_returns_early",
]


def pytest_run(root: Path) -> tuple[str, dict[str, str]]:
    folder = root / ".git" / "grader"
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in results.files().items():
        (folder / name).write_text(text)
    script = (
        results.shell_setup(str(folder))
        + f"{sys.executable} -m pytest --no-header -rA --tb=no -p no:cacheprovider tests\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    done = subprocess.run(
        ["bash", "-c", f"exec {RECORDS_FD}>&2 2>&1\n" + script],
        cwd=root,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    status, _ = results.statuses(results.parse(done.stderr))  # (the plugin's records)
    return done.stdout, status


def test_canaries_are_real_tests_named_like_their_neighbours_that_fail_where_theirs_pass(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text(CODE)
    (tmp_path / "tests").mkdir()
    path = "tests/test_pkg.py"
    placed = canaries.place(path, TESTS, F2P, [], 6, random.Random(4))
    assert placed is not None and len(placed.canaries) == 6
    (tmp_path / path).write_text(placed.text)
    tree = ast.parse(placed.text)
    defs = {(scope, node.name): node for node, scope in canaries._tests(tree)}
    originals = {(scope, node.name): node for node, scope in canaries._tests(ast.parse(TESTS))}
    for canary in placed.canaries:
        node = defs[(canary.scope, canary.name)]
        assert node.lineno == canary.line > 1  # at its real line, in the file
        assert placed.text.splitlines()[canary.line - 1].strip().startswith(f"def {canary.name}(")
        assert canary.made_from != "tests/test_pkg.py::test_returns_early"  # may not reach the end
        assert (canary.scope, canary.name) not in originals
        words = {w for _, name in originals for w in name.split("_")}
        assert set(canary.name.split("_")) <= words  # made of the module's own words
        ref = canaries.test_ref(canary.made_from, path)
        source = originals[ref]
        # A copy of its test but for one changed assertion (same shape, decorators, class).
        assert len(node.body) == len(source.body) and len(node.decorator_list) == len(source.decorator_list)
        differ = [a for a, b in zip(node.body, source.body) if ast.dump(a) != ast.dump(b)]
        assert len(differ) == 1, canary
    assert "# comments stay with their test\ndef test_is_even" in placed.text
    log, status = pytest_run(tmp_path)
    originals_status = {k: v for k, v in status.items() if k.split("::")[-1].split("[")[0] in {n for _, n in originals}}
    assert set(originals_status.values()) == {"PASSED"}, log
    graded, rows, problem = canaries.judge(placed.canaries, path, status)
    assert graded == "failed" and problem is None, (rows, log)
    assert all(row["checked"] and row["status"] == "failed" for row in rows)
    left_out = canaries.canary_keys(placed.canaries, path, status)
    assert left_out and all(status[k] == "FAILED" for k in left_out)
    assert set(status) - left_out == set(originals_status)


def test_no_usable_test_means_no_canary_and_pass_to_pass_tests_serve_when_needed():
    assert canaries.place("t.py", "def test_x():\n    return\n", ["t.py::test_x"], [], 3, random.Random(0)) is None
    assert canaries.place("t.py", "def broken(:\n", ["t.py::test_x"], [], 3, random.Random(0)) is None
    text = "def test_a():\n    pass\n\n\ndef test_b():\n    assert len('ab') == 2\n"
    placed = canaries.place("t.py", text, ["t.py::test_a"], ["t.py::test_b"], 2, random.Random(0))
    assert placed is not None and {c.made_from for c in placed.canaries} == {"t.py::test_b"}
    # Tests of another file are not this file's.
    assert canaries.place("t.py", text, ["u.py::test_b"], [], 2, random.Random(0)) is None


def test_test_names_of_each_runner():
    assert canaries.test_ref("tests/t.py::C::test_x[1-a]", "tests/t.py") == ("C", "test_x")
    assert canaries.test_ref("tests/t.py::test_x", "./tests/t.py") == (None, "test_x")
    assert canaries.test_ref("tests/u.py::test_x", "tests/t.py") is None
    assert canaries.test_ref("test_x (app.tests.Cases)", "tests/app/tests.py") == ("Cases", "test_x")
    assert canaries.test_ref("test_x (app.tests.Cases.test_x)", "x.py") == ("Cases", "test_x")
    assert canaries.test_ref("test_x", "sympy/core/tests/test_basic.py") == (None, "test_x")
