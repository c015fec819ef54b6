"""The swe handler on a tiny repository in bubblewrap: gold and empty patches, a whole
episode with a scripted policy, patch taking and applying, typed test failures."""

from __future__ import annotations

import pytest

from rollserve.agent.tool_calls import format_tool_call
from rollserve.errors import AgentError, InfraError, TimeoutFailure
from rollserve.handlers.swe.handler import SWECandidate, SWEWork
from rollserve.handlers.swe.patch import Candidate
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from tests.handlers.swe import toy_repo

pytestmark = pytest.mark.skipif(
    BubblewrapRuntime.unavailable_reason() is not None,
    reason=f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}",
)


async def evaluate(handler, new_rollout, instance, patch):
    """The handler's EVAL for ``patch``, as if RUN had left it."""
    rollout = new_rollout(instance)
    rollout.state = SWECandidate(handler.task(instance), Candidate(patch=patch))
    try:
        return await handler.eval(rollout)
    finally:
        await handler.cleanup(rollout)


async def test_gold_patch_resolves_and_empty_does_not(handler, new_rollout, toy):
    swe = handler()
    gold = await evaluate(swe, new_rollout, toy, toy["patch"])
    assert gold.reward == 1.0, gold.details
    assert gold.details["resolved"] and gold.details["tests_ran"]
    assert gold.details["apply_command"] == "git apply --verbose"
    table = {t["test"]: t for t in gold.details["tests"]}
    assert table["tests/test_ops.py::test_mean"] == {
        "test": "tests/test_ops.py::test_mean",
        "kind": "FAIL_TO_PASS",
        "status": "PASSED",
        "ok": True,
    }
    assert gold.details["f2p_passed"] == 1 and gold.details["p2p_passed"] == 2

    empty = await evaluate(swe, new_rollout, toy, "")
    assert empty.reward == 0.0 and empty.details["reason"] == "empty patch"
    assert not empty.details["tests_ran"]


async def test_empty_patch_can_be_run(handler, new_rollout, toy):
    result = await evaluate(handler(empty_patch="run"), new_rollout, toy, "")
    assert result.reward == 0.0 and result.details["tests_ran"]
    table = {t["test"]: t for t in result.details["tests"]}
    assert table["tests/test_ops.py::test_mean"]["status"] == "FAILED"
    assert table["tests/test_ops.py::test_add"]["ok"]


async def test_a_patch_that_does_not_apply_is_unresolved(handler, new_rollout, toy):
    bad = toy["patch"].replace("len(values) - 1", "len(values) - 2")
    result = await evaluate(handler(), new_rollout, toy, bad)
    assert result.reward == 0.0 and result.details["patch_applied"] is False
    assert "does not apply" in result.details["reason"]


async def test_a_fuzzy_patch_applies_with_the_fallback(handler, new_rollout, toy):
    # Context lines shifted: git apply refuses, patch --fuzz takes it.
    shifted = (
        toy["patch"]
        .replace("@@ -4,4 +4,4 @@", "@@ -7,4 +7,4 @@")
        .replace("def mean(values):", "def mean(values):  ")
        .replace(" \n\n\n", "\n\n\n")
    )
    result = await evaluate(handler(), new_rollout, toy, shifted)
    assert result.details["patch_applied"], result.details.get("apply_log")
    assert result.details["apply_command"] != "git apply --verbose"


async def test_a_test_run_past_its_limit_is_the_agents_failure_unless_told_otherwise(handler, new_rollout, toy):
    slow = {**toy, "test_cmd": "sleep 30"}
    with pytest.raises(AgentError, match="did not finish within 1 s"):
        await evaluate(handler(test_timeout=1), new_rollout, slow, toy["patch"])
    with pytest.raises(TimeoutFailure):
        await evaluate(handler(test_timeout=1, stopped_tests="masked"), new_rollout, slow, toy["patch"])


async def test_a_test_script_stopped_before_its_tests_start_is_infra(handler, new_rollout, toy):
    """The set-up (before the start marker) is no patch's doing: evidence of infra."""
    stuck = {**toy, "eval_script": "#!/bin/bash\necho setting up\nsleep 30\n"}
    with pytest.raises(InfraError, match="before its tests started"):
        await evaluate(handler(test_timeout=1), new_rollout, stuck, toy["patch"])


async def test_a_missing_repository_is_infra(handler, new_rollout, toy):
    with pytest.raises(InfraError, match="no git bundle or mirror"):
        await evaluate(handler(), new_rollout, {**toy, "instance_id": "toy__other-9"}, toy["patch"])


# --- whole episodes with a scripted policy ----------------------------------------------
def call(name, **args):
    return format_tool_call(name, args)


FIX = [
    call("bash", command="grep -n 'len(values)' calc/ops.py"),
    call(
        "str_replace_editor",
        command="str_replace",
        path="/workspace/calc/ops.py",
        old_str="len(values) - 1",
        new_str="len(values)",
    ),
    call("bash", command="python -c 'import calc; print(calc.mean([1, 2, 3]))'"),
    "Fixed.\n" + call("finish"),
]


async def run_episode(swe, new_rollout, toy, replies):
    rollout = new_rollout(toy, max_turns=8, max_context_tokens=8192, llm=replies)
    try:
        await swe.init(rollout)
        await swe.run(rollout)
        assert rollout.resources.sandboxes == []  # RUN's sandbox is closed already
        return rollout, await swe.eval(rollout)
    finally:
        await swe.cleanup(rollout)


async def test_an_episode_that_fixes_the_bug_is_resolved(handler, new_rollout, toy, scripted):
    rollout, result = await run_episode(handler(), new_rollout, toy, scripted(list(FIX)))
    assert result.reward == 1.0, result.details
    assert result.details["finished"]
    assert "-    return sum(values) / (len(values) - 1)" in result.details["git_patch"]
    tool_outputs = [m["content"] for m in rollout.trajectory.messages if m["role"] == "tool"]
    assert "2.0" in tool_outputs[2]


async def test_an_episode_that_does_nothing_scores_zero(handler, new_rollout, toy, scripted):
    rollout, result = await run_episode(
        handler(), new_rollout, toy, scripted(["I looked; all good.\n" + call("finish")])
    )
    assert result.reward == 0.0 and result.details["reason"] == "empty patch"


async def test_binary_files_are_left_out_and_test_edits_are_reset(handler, new_rollout, toy, scripted):
    replies = [
        call(
            "bash",
            command="printf '\\x00\\x01binary' > blob.bin && "
            "sed -i 's/len(values) - 1/len(values)/' calc/ops.py && "
            "echo 'def test_mean():\n    assert False' >> tests/test_ops.py",
        ),
        call("finish"),
    ]
    _, result = await run_episode(handler(), new_rollout, toy, scripted(replies))
    assert result.details["binary_files_left_out"] == ["blob.bin"]
    assert "blob.bin" not in result.details["git_patch"]
    assert "tests/test_ops.py" in result.details["git_patch"]  # kept, then reset in EVAL
    assert result.reward == 1.0, result.details


async def test_a_mirror_becomes_a_bundle_without_later_commits(handler, new_rollout, toy, tmp_path):
    """A local mirror (a bare repository) with history past base_commit: the sandbox
    gets the repository at base_commit and nothing after it (no future fix leaks)."""
    mirror_root = tmp_path / "mirrors"
    work = tmp_path / "work"
    toy_repo._git(tmp_path, "clone", "-q", "-b", "main", str(tmp_path / "mirror" / "toy__calc-1.bundle"), str(work))
    ops = work / "calc" / "ops.py"
    ops.write_text(ops.read_text().replace(toy_repo.BUGGY, toy_repo.FIXED))
    toy_repo._git(work, "commit", "-qam", "the fix, later")
    toy_repo._git(tmp_path, "clone", "-q", "--bare", str(work), str(mirror_root / "toy__calc.git"))
    instance = {**toy, "instance_id": "toy__calc-2"}  # no bundle of its own: the mirror serves
    swe = handler(mirrors=[str(mirror_root)], repo_cache=str(tmp_path / "cache"))
    rollout = new_rollout(instance)
    try:
        await swe.init(rollout)
        sandbox = swe.state(rollout, SWEWork).sandbox
        log = await sandbox.exec("git log --all --format=%s", timeout=30)
        assert log.stdout.split() == ["calc"], log.stdout  # only base_commit's history
        assert toy_repo.BUGGY in (sandbox.workspace / "calc" / "ops.py").read_text()
    finally:
        await swe.cleanup(rollout)
    assert len(list((tmp_path / "cache").glob("*.bundle"))) == 1  # cached for the next rollout


async def test_files_the_environment_left_are_not_the_agents(handler, new_rollout, toy, scripted):
    """An image may hold untracked or modified files at the start (build output, a
    patched config): the candidate is measured from the workspace as the episode began."""
    swe = handler()
    opened = swe._open

    async def open_like_an_image(rollout, task, harness=None):
        sandbox = await opened(rollout, task, harness)
        await sandbox.exec(
            "mkdir -p build && echo artefact > build/lib.txt && echo '# set by the image' >> calc/__init__.py",
            timeout=10,
        )
        return sandbox

    swe._open = open_like_an_image
    rollout, result = await run_episode(swe, new_rollout, toy, scripted(list(FIX)))
    patch = result.details["git_patch"]
    assert "calc/ops.py" in patch and "build/lib.txt" not in patch and "calc/__init__.py" not in patch


async def test_a_test_run_killed_by_a_signal_is_the_agents_failure_unless_told_otherwise(handler, new_rollout, toy):
    """Code under test can kill its runner at will (os.killpg(0, 9)): not evidence of
    an infrastructure fault, or a patch could buy itself a mask."""
    killed = {**toy, "test_cmd": "kill -KILL $$"}  # the test script itself dies
    with pytest.raises(AgentError, match="killed by signal 9"):
        await evaluate(handler(), new_rollout, killed, toy["patch"])
    with pytest.raises(InfraError, match="killed"):
        await evaluate(handler(stopped_tests="masked"), new_rollout, killed, toy["patch"])


async def test_host_sandboxes_see_neither_the_mirrors_nor_the_bundled_answers(handler, new_rollout, toy, tmp_path):
    """bubblewrap shows the host root: the mirrors and cut bundles (history past
    base_commit) and the bundled suite (its gold patches) are covered inside."""
    from rollserve.datasets import SWE_MINI
    from rollserve.handlers.swe.environment import repo_cache

    swe = handler()
    rollout = new_rollout(toy)
    try:
        await swe.init(rollout)
        sandbox = swe.state(rollout, SWEWork).sandbox
        assert str((tmp_path / "mirror").resolve()) in sandbox.spec.hide
        assert str(repo_cache(swe.options)) in sandbox.spec.hide  # other tasks' cuts
        seen = await sandbox.exec(f"ls -A {SWE_MINI.path.parent}; cat {SWE_MINI.path}", timeout=30)
        assert seen.stdout.strip() == "" and "No such file" in seen.stderr, seen
    finally:
        await swe.cleanup(rollout)
