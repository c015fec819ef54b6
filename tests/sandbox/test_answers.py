"""Where the host holds rollserve's bundled answers (sandbox/answers.py), and that a
real sandbox shows none of it: not the checkout's files, not its git history."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from rollserve.sandbox import answers
from rollserve.sandbox.base import SandboxSpec
from rollserve.sandbox.bubblewrap import BubblewrapRuntime

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="no git")


def git(*args: str, cwd: Path) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        timeout=60,
    )


@needs_git
def test_a_checkout_with_linked_work_trees_is_found_whole(tmp_path):
    main = tmp_path / "main"
    (main / "src" / "rollserve" / "data").mkdir(parents=True)
    (main / "src" / "rollserve" / "data" / "code_tasks.jsonl").write_text('{"answer": 1}\n')
    git("init", "-q", cwd=main)
    git("add", ".", cwd=main)
    git("commit", "-qm", "answers", cwd=main)
    git("worktree", "add", "-q", str(tmp_path / "elsewhere" / "wt"), cwd=main)
    linked = tmp_path / "elsewhere" / "wt"
    expected = {main, main / ".git", linked}
    # From the linked work tree's package (as `PYTHONPATH=src` runs it) and from the main one.
    assert answers._checkout_of(linked / "src" / "rollserve") == expected
    assert answers._checkout_of(main / "src" / "rollserve") == expected


def test_an_installed_copy_is_no_checkout(tmp_path):
    package = tmp_path / "lib" / "python3.11" / "site-packages" / "rollserve"
    package.mkdir(parents=True)
    assert answers._checkout_of(package) == set()


def test_the_running_package_is_covered():
    assert answers.PACKAGE / "data" in answers.answer_folders()
    top = answers.PACKAGE.parent.parent
    if (top / ".git").exists():  # run from a checkout (CI, development)
        assert top in answers.checkouts()


@pytest.mark.skipif(BubblewrapRuntime.unavailable_reason() is not None, reason="no bwrap")
async def test_no_checkout_nor_its_history_is_readable_inside(tmp_path):
    runtime = BubblewrapRuntime(tmp_path / "state")
    shown = {Path(p) for p in runtime.readonly_paths()}  # e.g. the server's venv, bound back
    async with await runtime.start(SandboxSpec()) as box:
        for folder in answers.checkouts():
            if Path("/tmp") in folder.parents:
                continue  # every sandbox has its own /tmp
            listed = await box.exec(["ls", "-A", str(folder)], 10)
            names = set(listed.stdout.split())
            assert names <= {p.relative_to(folder).parts[0] for p in shown if folder in p.parents}, (folder, names)
            history = await box.exec(
                ["git", "-c", "safe.directory=*", "-C", str(folder), "log", "--all", "--oneline"], 10
            )
            assert history.exit_code != 0 and not history.stdout, (folder, history)
        for folder in answers.answer_folders():
            if Path("/tmp") not in folder.parents:
                listed = await box.exec(["ls", "-A", str(folder)], 10)
                assert listed.stdout == "", (folder, listed)
