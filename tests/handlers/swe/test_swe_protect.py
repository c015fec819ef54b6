"""Which changes of a candidate patch are test infrastructure (``protect``), on real
``git diff`` output, odd file names included."""

from __future__ import annotations

import dataclasses
import subprocess

import pytest

from rollserve.handlers.swe.evaluate import runner_paths
from rollserve.handlers.swe.instances import parse_task
from rollserve.handlers.swe.protect import is_protected, shadows, split


@pytest.mark.parametrize(
    "path",
    [
        "conftest.py",
        "tests/conftest.py",
        "src/pkg/CONFTEST.py",
        "pytest.ini",
        ".pytest.ini",
        "tox.ini",
        "setup.cfg",
        "pyproject.toml",
        "sub/pyproject.toml",
        "sitecustomize.py",
        "lib/usercustomize.py",
        "evil.pth",
        "tests/__init__.py",
        "tests/helpers.py",
        "pkg/testing/utils.py",
        "test/x.py",
        "test_calc.py",
        "pkg/calc_test.py",
        "pkg/tests.py",
        "calc.egg-info/entry_points.txt",
        "x-1.0.dist-info/entry_points.txt",
        "calc.egg-link",
        "pytest.py",
        "_pytest/reports.py",
        "pluggy/__init__.py",
        "py.py",
        "tests",
        "bin/test",
        "pytest.toml",
        ".pytest.toml",
        "sub/pytest.toml",
        "sympy/utilities/runtests.py",
        "sympy/testing/runtests.py",
        "sympy/utilities/pytest.py",
        "run_tests.sh",
        "runtests.py",
    ],
)
def test_test_infrastructure_is_protected(path):
    assert is_protected(path)


@pytest.mark.parametrize(
    "path",
    [
        "calc/ops.py",
        "setup.py",
        "src/pytest.py",
        "latest.py",
        "contest.py",
        "docs/index.rst",
        "README.md",
        "pkg/attestation.py",
        "reproduce.py",
        "src/_pytest_helpers.py",
    ],
)
def test_source_files_are_not(path):
    assert not is_protected(path)


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repo(tmp_path):
    git(tmp_path, "init", "-q")
    git(tmp_path, "config", "user.email", "t@t")
    git(tmp_path, "config", "user.name", "t")
    (tmp_path / "tests").mkdir()
    (tmp_path / "calc.py").write_text("x = 1\n")
    (tmp_path / "tests" / "test_a b.py").write_text("a = 1\n")
    (tmp_path / 'od"d\tname.py').write_text("q = 1\n")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "base")
    return tmp_path


def diff(repo) -> str:
    git(repo, "add", "-A")
    return git(repo, "diff", "--cached", "--no-color")


def test_the_protected_files_changes_are_split_off_whatever_their_names(repo):
    (repo / "calc.py").write_text("x = 2\n")
    (repo / "tests" / "test_a b.py").write_text("a = 2\n")  # a space: a tab after the name
    (repo / "tests" / "__init__.py").write_text("")  # empty: no ---/+++ lines at all
    (repo / "é").mkdir()
    (repo / "é" / "conftest.py").write_text("import pytest\n")  # quoted, octal escapes
    git(repo, "mv", 'od"d\tname.py', "renamed.py")  # quoted, escapes, a rename
    (repo / "sitecustomize.py").write_text("import os\n")
    patch = diff(repo)
    result = split(patch)
    assert sorted(result.protected) == sorted(
        ["tests/test_a b.py", "tests/__init__.py", "é/conftest.py", "sitecustomize.py"]
    )
    assert "calc.py" in result.kept and "renamed.py" in result.kept
    assert "conftest" not in result.kept and "sitecustomize" not in result.kept
    # What is kept is still a patch git applies, to exactly the unprotected files.
    git(repo, "reset", "-q", "--hard")
    git(repo, "clean", "-fdq")
    (repo / "kept.diff").write_text(result.kept)
    git(repo, "apply", "kept.diff")
    (repo / "kept.diff").unlink()
    git(repo, "add", "-A")
    changed = git(repo, "diff", "--cached", "--name-only", "--no-renames").split("\n")
    assert sorted(filter(None, changed)) == ['"od\\"d\\tname.py"', "calc.py", "renamed.py"]


def test_a_rename_out_of_a_protected_folder_is_protected(repo):
    git(repo, "mv", "tests/test_a b.py", "moved.py")
    result = split(diff(repo))
    assert result.protected == ["tests/test_a b.py"] and result.kept == ""


def test_text_that_is_not_a_git_diff_is_never_trusted():
    assert split("").protected == [] and split("").kept == ""
    assert split("--- a/conftest.py\n+++ b/conftest.py\n@@ -0,0 +1 @@\n+x\n").protected
    tail = "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1 +1 @@\n-x\n+y\n"
    assert split("junk before\n" + tail).protected == ["(text before the first diff)"]
    assert split(tail).protected == [] and split(tail).kept == tail


@pytest.mark.parametrize(
    "path",
    ["iniconfig.py", "packaging/__init__.py", "pluggy.py", "argparse.py", "json/__init__.py", "typing.py", "site.py"],
)
def test_a_new_root_module_that_shadows_the_stdlib_or_an_installed_package_is_refused(repo, path):
    assert shadows(path)
    (repo / path).parent.mkdir(parents=True, exist_ok=True)
    (repo / path).write_text("import os\n")
    (repo / "calc.py").write_text("x = 2\n")
    done = split(diff(repo))
    assert done.protected == [path] and "calc.py" in done.kept and path not in done.kept


def test_a_changed_module_or_a_new_one_deeper_down_is_not_a_shadow(repo):
    (repo / "calc.py").write_text("x = 2\n")
    (repo / "pkg").mkdir()
    (repo / "pkg" / "json.py").write_text("x = 1\n")
    (repo / "mycalc.py").write_text("x = 1\n")
    assert not shadows("pkg/json.py") and not shadows("calc.py") and not shadows("mycalc.py")
    assert split(diff(repo)).protected == []


def test_a_new_shadow_made_by_renaming_is_refused(repo):
    git(repo, "mv", "calc.py", "inspect.py")
    assert split(diff(repo)).protected == ["inspect.py"]


PATCH = (
    "diff --git a/sympy/core/tests/test_x.py b/sympy/core/tests/test_x.py\n"
    "--- a/sympy/core/tests/test_x.py\n+++ b/sympy/core/tests/test_x.py\n@@ -1 +1 @@\n-a\n+b\n"
)


def test_the_files_a_test_command_runs_are_protected():
    sympy = parse_task(
        {
            "instance_id": "sympy__sympy-1",
            "repo": "sympy/sympy",
            "base_commit": "a" * 40,
            "problem_statement": "x",
            "test_patch": PATCH,
            "FAIL_TO_PASS": '["test_x"]',
            "PASS_TO_PASS": "[]",
            "version": "1.1",
        }
    )
    assert runner_paths(sympy) == {"bin/test"}
    own = dataclasses.replace(sympy, test_cmd="PYTHONPATH=. ./tools/run.py -v {files} && bash scripts/check.sh")
    assert runner_paths(own) == {"tools/run.py", "scripts/check.sh"}
    patch = "diff --git a/tools/run.py b/tools/run.py\n--- a/tools/run.py\n+++ b/tools/run.py\n@@ -1 +1 @@\n-a\n+b\n"
    assert split(patch, runner_paths(own)).protected == ["tools/run.py"]
    assert split(patch).protected == []
