"""Image mode's repository: the image's ``/testbed`` keeps its whole history, so
``prepare_image_repo`` cuts it at HEAD as a bundle is cut. No image runtime is needed to
prove it: the same script runs on a repository with later commits, branches, tags, a
stash, reflogs and an unreachable commit in a real bubblewrap sandbox's workspace."""

from __future__ import annotations

import re

import pytest

from rollserve.handlers.swe.environment import SWEOptions, prepare_image_repo
from rollserve.sandbox.base import SandboxSpec
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from tests.handlers.swe import toy_repo

pytestmark = pytest.mark.skipif(
    BubblewrapRuntime.unavailable_reason() is not None,
    reason=f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}",
)

# What an image's repository may hold: the fix committed later on main, a branch and a
# tag at it, a stash, a remote-tracking ref, an unreachable commit, reflogs; HEAD at base.
IMAGE_REPO = """set -e
git clone -q repo.bundle .rollserve-tmp && mv .rollserve-tmp/.git .git && rm -rf .rollserve-tmp repo.bundle
git checkout -q -f main
git config user.email t@t && git config user.name t
sed -i 's|(len(values) - 1)|len(values)|' calc/ops.py && git commit -qam 'the fix, later'
git branch fixed && git tag v1-fixed && git update-ref refs/remotes/origin/main HEAD
echo 1 > stash.txt && git add stash.txt && git stash -q
git commit -q --allow-empty -m dangling && git reset -q --hard HEAD~1
git checkout -q {base}
echo '# local' >> calc/ops.py && echo new > untracked.txt
"""
LOOK = (
    "echo REFS $(git for-each-ref | wc -l) REFLOG $(git reflog 2>/dev/null | wc -l); "
    "git log --all --format='LOG %s'; git fsck --unreachable --no-reflogs 2>&1 | sed 's/^/FSCK /'; "
    "git cat-file --batch-all-objects --batch-check='OBJ %(objectname)'; git status --short"
)


async def test_the_images_repository_is_cut_at_head(tmp_path):
    instance = toy_repo.build(tmp_path / "source")
    runtime = BubblewrapRuntime(tmp_path / "state")
    sandbox = await runtime.start(SandboxSpec())
    try:
        repo = tmp_path / "source" / "repo"
        bundle = tmp_path / "all.bundle"
        toy_repo._git(repo, "bundle", "create", "-q", str(bundle), "--all")
        await sandbox.write_file("repo.bundle", bundle.read_bytes())
        made = await sandbox.exec(IMAGE_REPO.format(base=instance["base_commit"]), timeout=120)
        assert made.ok, made.failure()
        before = await sandbox.exec(LOOK + "; echo FIXED $(git rev-parse fixed:calc/ops.py)", timeout=60)
        fixed_blob = re.search(r"^FIXED (\w+)$", before.stdout, re.MULTILINE).group(1)
        assert f"OBJ {fixed_blob}" in before.stdout
        assert "LOG the fix, later" in before.stdout and "REFLOG 0" not in before.stdout
        assert "FSCK unreachable commit" in before.stdout, before.stdout

        await prepare_image_repo(sandbox, SWEOptions())

        seen = (await sandbox.exec(LOOK, timeout=60)).stdout
        assert re.search(r"^REFS 0 REFLOG 0$", seen, re.MULTILINE), seen
        assert re.findall(r"^LOG (.+)$", seen, re.MULTILINE) == ["calc"]
        assert "FSCK" not in seen
        reachable = toy_repo._git(repo, "rev-list", "--objects", instance["base_commit"])
        objects = set(re.findall(r"^OBJ (\w+)$", seen, re.MULTILINE))
        assert {line.split()[0] for line in reachable.splitlines()} <= objects
        # Only HEAD's objects and the index's: no blob of the later fix.
        later = (await sandbox.exec("git rev-parse HEAD; git diff --stat; cat calc/ops.py", timeout=30)).stdout
        assert later.startswith(instance["base_commit"]) and toy_repo.BUGGY in later
        assert fixed_blob not in objects
        # The image's working tree is left as it was (a change, an untracked file).
        assert " M calc/ops.py" in seen and "?? untracked.txt" in seen
    finally:
        await sandbox.close()
