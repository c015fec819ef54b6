"""The strict diff reader under ``protect.split``: every line of a candidate patch is
accounted for by the hunks' line counts, so a file header slipped in after a hunk (which
``git apply`` and ``patch`` would read as another file) is never passed through."""

from __future__ import annotations

import subprocess

import pytest

from rollserve.handlers.swe.diffparse import parse
from rollserve.handlers.swe.protect import split

SOURCE = (
    "diff --git a/calc.py b/calc.py\nindex 1111111..2222222 100644\n"
    "--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n x = 1\n-y = 2\n+y = 3\n"
)
SMUGGLED = "--- a/conftest.py\n+++ b/conftest.py\n@@ -0,0 +1,2 @@\n+import pytest\n+FORGED = True\n"


def git(repo, *args, stdin=None):
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, input=stdin
    ).stdout


@pytest.fixture
def repo(tmp_path):
    git(tmp_path, "init", "-q")
    (tmp_path / "calc.py").write_text("x = 1\ny = 2\n")
    git(tmp_path, "add", "-A")
    git(tmp_path, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "base")
    return tmp_path


def applies(repo, patch: str, command: list[str]) -> list[str]:
    """The files ``command`` (git apply or patch) changes with ``patch``."""
    (repo.parent / "p.diff").write_text(patch)
    subprocess.run([*command, str(repo.parent / "p.diff")], cwd=repo, check=True, capture_output=True)
    git(repo, "add", "-A")
    return git(repo, "diff", "--cached", "--name-only").split()


@pytest.mark.parametrize("command", [["git", "apply"], ["patch", "--batch", "-p1", "-i"]])
def test_a_file_header_after_a_hunk_is_another_file_to_both_tools_and_is_refused(repo, command):
    patch = SOURCE + SMUGGLED
    assert sorted(applies(repo, patch, command)) == ["calc.py", "conftest.py"]  # the hole
    result = split(patch)
    assert "conftest.py" not in result.kept and result.kept == ""
    assert any("conftest.py" in name for name in result.protected)


def test_counts_that_do_not_add_up_are_refused():
    short = SOURCE.replace("@@ -1,2 +1,2 @@", "@@ -1,1 +1,1 @@")  # a line left over
    long = SOURCE.replace("@@ -1,2 +1,2 @@", "@@ -1,3 +1,3 @@")  # the hunk ends early
    inside = SOURCE.replace("-y = 2\n", "-y = 2\ndiff --git a/conftest.py b/conftest.py\n")
    for patch in (
        short,
        long,
        inside,
        SOURCE + "\\ No newline at end of file\n" * 2,
        SOURCE + "garbage\n",
        SOURCE.replace("@@ -1,2 +1,2 @@", "@@ -1,0 +1,0 @@"),
    ):
        result = split(patch)
        assert result.kept == "" and result.protected, patch


def test_a_second_header_pair_before_the_hunks_is_refused():
    patch = SOURCE.replace("+++ b/calc.py\n", "+++ b/calc.py\n--- a/conftest.py\n+++ b/conftest.py\n")
    assert split(patch).kept == "" and split(patch).protected


@pytest.mark.parametrize(
    "header",
    [
        "diff --git x/iniconfig.py x/iniconfig.py\nnew file mode 100644\n--- /dev/null\n"
        "+++ x/iniconfig.py\n",  # diff.noprefix-like: -p1 writes a root iniconfig.py
        "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/conftest.py\n",  # names disagree
        "diff --git a/calc.py b/calc.py\n--- calc.py\n+++ calc.py\n",  # no prefixes
        "diff --git a/calc.py b/calc.py\nBinary files a/calc.py and b/calc.py differ\n",
        "diff --git a/calc.py b/calc.py\nGIT binary patch\n",
        "diff --git a/calc.py b/calc.py\nnot a header\n--- a/calc.py\n+++ b/calc.py\n",
        "diff --git a/.git/config b/.git/config\n--- a/.git/config\n+++ b/.git/config\n",
        "diff --git a/x/../conftest.py b/x/../conftest.py\n--- a/x/../conftest.py\n+++ b/x/../conftest.py\n",
    ],
)
def test_headers_the_reader_cannot_account_for_are_refused(header):
    patch = header + "@@ -1 +1 @@\n-a\n+b\n"
    assert split(patch).kept == "" and split(patch).protected, header


def test_a_rename_or_copy_to_a_protected_path_or_a_shadow_is_refused():
    for kind in ("rename", "copy"):
        for target in ("tests/conftest.py", "inspect.py"):
            patch = f"diff --git a/calc.py b/{target}\nsimilarity index 100%\n{kind} from calc.py\n{kind} to {target}\n"
            assert split(patch).protected == [target], (kind, target)
    lying = (
        "diff --git a/calc.py b/ops.py\nsimilarity index 100%\n"
        "rename from calc.py\nrename to conftest.py\n"
    )  # headers that disagree
    assert split(lying).kept == "" and "conftest.py" in " ".join(split(lying).protected)


def test_a_change_from_an_empty_old_file_at_the_root_counts_as_making_it():
    """``patch`` makes a missing file for a hunk from line 0, so "modifying" a root
    ``iniconfig.py`` the base does not have is a new module that shadows pytest's."""
    patch = (
        "diff --git a/iniconfig.py b/iniconfig.py\n--- a/iniconfig.py\n+++ b/iniconfig.py\n@@ -0,0 +1 @@\n+import os\n"
    )
    assert split(patch).protected == ["iniconfig.py"]


def test_real_diffs_with_awkward_content_are_read_whole(repo):
    """Lines that look like headers inside hunks, no newline at the end, empty and
    CRLF lines, form feeds: all content, all kept, and the kept patch still applies."""
    (repo / "calc.py").write_text(
        "x = 1\n-- a/conftest.py\n\n\x0cz = 3\r\n++ b/conftest.py\ndiff --git a/conftest.py b/conftest.py\nend"
    )
    (repo / "notes.txt").write_text("@@ -1 +1 @@\n--- a/x\n")
    (repo / "empty.py").write_text("")
    git(repo, "add", "-A")
    patch = git(repo, "-c", "diff.suppressBlankEmpty=true", "diff", "--cached")
    preamble, blocks = parse(patch)
    assert preamble == "" and [b.problems for b in blocks] == [[], [], []]
    assert [b.paths for b in blocks] == [["calc.py"], ["empty.py"], ["notes.txt"]]
    assert [b.created for b in blocks] == [[], ["empty.py"], ["notes.txt"]]
    result = split(patch)
    assert result.protected == [] and result.kept == patch
    git(repo, "reset", "-q", "--hard")
    git(repo, "clean", "-fdq")
    assert sorted(applies(repo, result.kept, ["git", "apply"])) == ["calc.py", "empty.py", "notes.txt"]
