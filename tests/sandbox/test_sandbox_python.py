"""The sandboxes' own Python (sandbox_python.py) and the server's packages hidden from
every sandbox (server_python.py, bwrap_view.py)."""

from __future__ import annotations

import os
import site
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rollserve.sandbox import sandbox_python
from rollserve.sandbox.base import SandboxLimits
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from rollserve.sandbox.config import BubblewrapConfig
from rollserve.sandbox.folders import SandboxFolders
from rollserve.sandbox.server_python import base_prefix, site_dirs, within

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="bubblewrap is Linux only")


def test_every_folder_of_the_servers_packages_is_one_to_hide_and_the_stdlib_is_not():
    dirs = site_dirs()
    for folder in [*site.getsitepackages(), sysconfig.get_paths()["purelib"]]:
        assert within(Path(folder).resolve(), dirs), folder
    if sys.prefix != sys.base_prefix:  # the venv the server runs from, as a whole
        # (itself, or a folder holding it: pytest puts the checkout, which may hold
        # the venv, on sys.path)
        assert within(Path(sys.prefix).resolve(), dirs)
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    assert not within(stdlib, dirs) and not any(d in stdlib.parents for d in dirs)
    assert Path("/") not in dirs and not within(base_prefix(), dirs)


NEEDS = ["ipython", "pytest"]  # (the defaults add more, slower to link)


def test_the_made_python_holds_what_sandboxes_need_and_nothing_else(tmp_path):
    cache = tmp_path / "cache"
    # Two servers making it at once: one prefix, whole, for both.
    with ThreadPoolExecutor(2) as pool:
        made = list(pool.map(lambda _: sandbox_python.ensure(cache, NEEDS), range(2)))
    assert made[0] == made[1] and (made[0] / sandbox_python.MANIFEST).is_file()
    assert [p.name for p in cache.iterdir()] == [made[0].name]  # no build left behind
    packages = sandbox_python.site_packages(made[0])
    assert (packages / "IPython").is_dir() and (packages / "_pytest").is_dir()
    assert not (packages / "reasoning_gym").exists() and not (packages / "rollserve").exists()
    assert sandbox_python.ensure(cache, NEEDS) == made[0]  # kept


def test_a_cache_others_may_write_is_refused(tmp_path):
    cache = tmp_path / "shared"
    cache.mkdir()
    os.chmod(cache, 0o777)
    with pytest.raises(OSError, match="closed to others' writes"):
        sandbox_python.ensure(cache, ["pytest"])


@pytest.mark.parametrize(
    "config", [BubblewrapConfig(), BubblewrapConfig(root_uids=None)], ids=["default", "root_uids=None"]
)
def test_site_dirs_are_covered_over_the_bound_interpreter(tmp_path, config):
    """The base interpreter is bound back when a hidden folder covers it (and the
    sandbox's uid can reach it), and its own site-packages (pyenv keeps packages
    there) covered on top, after the bind; every other site dir is hidden or covered."""
    base = base_prefix()
    runtime = BubblewrapRuntime(tmp_path / "state", config)
    folders = SandboxFolders.create(tmp_path / "root", "t")
    args = runtime.view.args("/", folders, SandboxLimits(), False, [])
    covered = [args[i + 1] for i, a in enumerate(args) if a == "--tmpfs"]
    bound = str(base) in runtime.readonly_paths()
    for folder in site_dirs():
        # Hidden with its folder, or under /tmp, which every sandbox has its own of (a
        # checkout under /tmp that pytest put on sys.path).
        covering = [Path(p) for p in runtime.hidden()] + [Path("/tmp")]
        if within(folder, covering) and not (bound and within(folder, [base])):
            continue
        assert str(folder) in covered, folder
        if bound:
            assert args.index(str(folder)) > args.index(str(base))


async def test_a_python_that_could_not_be_made_is_named_where_none_is_found(tmp_path):
    """The sandboxes' Python cannot be made (a cache others may write): a sandbox still
    starts (bash needs no Python), and whatever then looks for a python inside is told
    why there is none, not only that the host's python3 lacks the module."""
    from rollserve.handlers.sandboxed import python_with
    from rollserve.sandbox.base import SandboxError, SandboxSpec

    if BubblewrapRuntime.unavailable_reason() is not None:
        pytest.skip(f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}")
    cache = tmp_path / "shared"
    cache.mkdir()
    os.chmod(cache, 0o777)
    runtime = BubblewrapRuntime(tmp_path / "state", BubblewrapConfig(python_cache=str(cache)))
    sandbox = await runtime.start(SandboxSpec())
    try:
        assert sandbox.python_prefix is None and "closed to others' writes" in sandbox.python_error
        with pytest.raises(SandboxError, match="could not be made under .*closed to others"):
            await python_with(sandbox, "IPython")
    finally:
        await sandbox.close()
