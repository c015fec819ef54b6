"""The SWE handler's Apptainer path, on the stand-in ``apptainer`` (the real one cannot
be installed here): the image named as SWE-bench names it and built into the cache as
a .sif, the repository seeded from the image's /testbed into the workspace, the
workspace also mounted at /testbed, and the eval script in SWE-bench's shape."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from rollserve.handlers.base import HandlerContext
from rollserve.handlers.swe import SWEHandler
from rollserve.handlers.swe.evaluate import eval_script
from rollserve.handlers.swe.handler import SWEWork
from rollserve.sandbox.apptainer import ApptainerRuntime, cache_name
from tests.handlers.swe import toy_repo


@pytest.fixture
def image_root(tmp_path, fake_apptainer):
    """The image's files: /testbed is a checkout of the toy repository at base."""
    instance = toy_repo.build(tmp_path / "mirror")
    root = tmp_path / "image"
    subprocess.run(
        ["git", "clone", "-q", "-b", "main", str(tmp_path / "mirror" / "toy__calc-1.bundle"), str(root / "testbed")],
        check=True,
    )
    (tmp_path / "bin" / "image_root").write_text(str(root))  # read by the stand-in
    return instance


async def test_init_builds_the_swe_bench_image_and_seeds_the_workspace(
    fake_apptainer, image_root, tokenizer, new_rollout, tmp_path
):
    runtime = ApptainerRuntime(tmp_path / "state")
    ctx = HandlerContext(
        tokenizer=tokenizer,
        scoring=None,
        sandboxes=runtime,
        options={"swe": {"image_prefix": "docker.io/swebench/sweb.eval.x86_64."}},
    )
    handler = SWEHandler(ctx)
    expected = "docker://docker.io/swebench/sweb.eval.x86_64.toy_1776_calc-1:latest"
    assert handler.images(image_root) == [expected]
    rollout = new_rollout(image_root)
    try:
        await handler.init(rollout)
        sandbox = handler.state(rollout, SWEWork).sandbox
        (build,) = fake_apptainer("build")
        assert build["argv"][2] == expected
        assert sandbox.image == runtime.images.folder / cache_name(expected)
        seed, prepare, cut, probe, snapshot = fake_apptainer("exec")
        # The seed runs without the alias (it would hide the image's /testbed) ...
        assert f"{sandbox.workspace}:/testbed" not in seed["argv"]
        assert seed["argv"][-4:] == ["cp", "-a", "/testbed/.", "/workspace/"]
        # ... every later command has the workspace at /testbed too.
        argv = prepare["argv"]
        assert argv[argv.index(f"{sandbox.workspace}:/testbed") - 1] == "--bind"
        assert argv[argv.index("--home") + 1] == f"{sandbox.workspace}:/workspace"
        assert (sandbox.workspace / "calc" / "ops.py").is_file()  # the repository, seeded
        assert "safe.directory" in argv[-1]
        # The image's history is cut at HEAD (the stand-in runs it on the seeded copy).
        assert "git repack -a -d" in cut["argv"][-1]
        refs = subprocess.run(
            ["git", "-C", str(sandbox.workspace), "for-each-ref"], capture_output=True, text=True, check=True
        ).stdout
        assert refs == ""
        # The tests' interpreter is tried in the image's environment (interpreter.py).
        assert "conda activate testbed" in probe["argv"][-1]
        assert "python -c 'import pytest'" in probe["argv"][-1]
        assert f"{sandbox.workspace}:/testbed" in snapshot["argv"]
        assert len(handler.state(rollout, SWEWork).baseline) == 40  # the workspace's tree at the start
    finally:
        await handler.cleanup(rollout)
    assert not sandbox.workspace.exists()


def test_the_eval_script_activates_the_image_environment(image_root, tokenizer):
    handler = SWEHandler(HandlerContext(tokenizer=tokenizer, scoring=None))
    task = handler.task(image_root)
    script = eval_script(task, handler.options.image_activate).splitlines()
    assert script[2] == handler.options.image_activate
    assert "conda activate testbed" in handler.options.image_activate
    assert any(line.startswith("python -m pytest") for line in script)


@pytest.mark.skipif(
    shutil.which("apptainer") is None and shutil.which("singularity") is None,
    reason="apptainer/singularity is not on PATH here (it cannot be installed on "
    "this machine); the SWE image path is tested on its command lines above",
)
def test_real_apptainer_names_the_same_image(image_root, tokenizer):
    from rollserve.sandbox.registry import get_runtime

    runtime = get_runtime("apptainer")
    handler = SWEHandler(HandlerContext(tokenizer=tokenizer, scoring=None, sandboxes=runtime))
    assert handler.images(image_root)[0].startswith("docker://swebench/sweb.eval.x86_64.")
