"""The bundled Harbor-format tasks (``rollserve/data/harbor``): each folder is a complete
task (Harbor's layout, a ``task.toml`` with the fields we rely on, no network), and
each one runs for real in a bubblewrap sandbox through the sandbox API, the way the
``harbor`` family runs it: the files beside the Dockerfile laid into the workspace,
the workspace at the task's workdir (/app), ``solution/`` copied in and ``solve.sh``
run (the oracle), then ``tests/`` copied in and ``test.sh`` run, and the reward read
from ``/logs/verifier`` (reward.json first, as Harbor reads it). The oracle scores 1;
the empty agent, and a hostile agent's obvious tries, score 0.

Here /logs is one more alias of the workspace (so /logs/verifier is the workspace's
``verifier`` folder), and tests/ and solution/ go to the sandbox's private /tmp: the
bundled scripts find their own files beside themselves, never at a fixed /tests or
/solution, and no check reads the top level of the workdir. (The family gives them
their Harbor paths; ``rollserve datasets oracle`` runs them through it.)
"""

from __future__ import annotations

import io
import json
import re
import shutil
import tarfile
import tomllib
from pathlib import Path

import pytest

import rollserve
from rollserve.sandbox.base import Sandbox, SandboxLimits, SandboxSpec
from rollserve.sandbox.bubblewrap import BubblewrapRuntime

HARBOR = Path(rollserve.__file__).resolve().parent / "data" / "harbor"
TASKS = sorted(p.name for p in HARBOR.iterdir() if p.is_dir()) if HARBOR.is_dir() else []
WORKDIR = "/app"
SCHEMA_VERSION = "1.4"  # Harbor 0.26's TaskConfig
SCRIPT_TIMEOUT_S = 60.0  # each solve.sh / test.sh takes a second or two; bound for a loaded host

needs_bwrap = pytest.mark.skipif(BubblewrapRuntime.unavailable_reason() is not None,
                                 reason=f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}")

# Harbor's task.toml fields (harbor/models/task/config.py) that the bundled tasks may use;
# anything else is a typo that Harbor would refuse or, worse, silently ignore.
SECTIONS = {
    "metadata": None,  # free-form in Harbor; ours: checked below
    "agent": {"timeout_sec", "user"},
    "verifier": {"timeout_sec", "env", "user"},
    "environment": {"network_mode", "cpus", "memory_mb", "storage_mb", "workdir", "env",
                    "build_timeout_sec"},
}

# What a hostile agent might try on each task instead of the work (run in /app after the
# agent's turn would end); every one must score 0. The tests sit at /tmp/tests here.
# Keyed by task, or "task:what" for a second try on one.
CHEATS = {
    "csv-region-revenue": "ln -s /tmp/tests/expected_summary.csv summary.csv",
    "access-log-report": "ln -s /tmp/tests/expected_report.json report.json",
    # The sample tests emptied, and a json module planted where a careless verifier imports it.
    "fix-inventory-bugs": "echo 'import unittest' > test_inventory.py && "
                          "printf 'def load(f):\\n    return []\\ndef loads(s):\\n    return []\\n' > json.py",
    # The history imported, and the tip named as the culprit (a guess, not the search).
    "git-bisect-revert": "git init -q -b main repo && git -C repo fast-import --quiet < history.fi && "
                         "git -C repo rev-parse main > culprit.txt",
    # A script that deletes the oldest .log files but also the links and ignores usage.
    "prune-logs-script": "printf '#!/bin/bash\\nls -tr \"$1\"/*.log | head -n -\"$2\" | while read f; do "
                         "rm -f \"$f\"; basename \"$f\"; done\\n' > prune.sh && chmod +x prune.sh",
    # Every user rolled up, the inactive ones too, team names as they stand.
    "json-team-rollup": "python3 -c 'import json; users = json.load(open(\"users.json\"))[\"users\"]; "
                        "teams = {t: [u for u in users if u.get(\"team\") == t] "
                        "for t in {u.get(\"team\") for u in users} if t}; "
                        "json.dump({t: {\"members\": sorted(m[\"username\"] for m in ms), \"count\": len(ms), "
                        "\"average_age\": round(sum(m[\"age\"] for m in ms) / len(ms), 1), "
                        "\"skills\": sorted({k for m in ms for k in m[\"skills\"]})} for t, ms in teams.items()}, "
                        "open(\"by_team.json\", \"w\"))'",
    # Everything made executable, the links right, nothing deleted; and a copy for a hard link.
    "release-links-perms": "chmod -R 755 releases && ln -s releases/v10 current && cp releases/v10/config.ini .",
    # Copied, not moved, and the duplicates kept.
    "sort-inbox-files": "mkdir -p sorted/other && find inbox -type f -exec cp {} sorted/other/ \\;",
    # The blunt rename: everywhere, the recorded output and the changelog too.
    "docs-rename-product": "find docs -name '*.md' -exec sed -i "
                           "'s/Acme Widget/Rollout Widget/g; s/acme-widget/rollout/g' {} +",
    # A library that reads the verifier's expected outcomes at import and prints them back.
    "fix-inventory-bugs:reads-the-tests": (
        "printf 'import glob, os\\nfor p in glob.glob(\"/tmp/tests/expected.json\"):\\n"
        "    print(open(p).read().replace(chr(10), \" \"), flush=True); os._exit(0)\\n' >> inventory/__init__.py"),
    # A Makefile that builds, but rebuilds everything every time.
    "make-incremental-build": "printf 'all:\\n\\tmkdir -p build bin\\n\\tfor f in main parse stats; do "
                              "cc -O2 -Wall -c -o build/$$f.o src/$$f.c; done\\n\\tcc -o bin/stats build/*.o\\n"
                              "clean:\\n\\trm -rf build bin\\n' > Makefile && make",
}


def task_dir(name: str) -> Path:
    return HARBOR / name


def environment_files(name: str) -> dict[str, str]:
    """What the workspace holds at the start: every file of environment/ but the Dockerfile."""
    env = task_dir(name) / "environment"
    return {str(path.relative_to(env)): path.read_text() for path in sorted(env.rglob("*"))
            if path.is_file() and path.relative_to(env) != Path("Dockerfile")}


def tar_of(folder: Path) -> bytes:
    """``folder``'s files as a tar (modes kept), to unpack inside a sandbox."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in sorted(folder.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(folder)), recursive=False)
    return buffer.getvalue()


async def copy_in(box: Sandbox, folder: Path, target: str) -> None:
    done = await box.exec(f"mkdir -p {target} && tar -x -C {target}", SCRIPT_TIMEOUT_S,
                          stdin=tar_of(folder))
    assert done.ok, done.failure()


async def verify(box: Sandbox, name: str, clear: bool = True) -> dict[str, float]:
    """Harbor's verification: stale rewards removed (unless ``clear`` is False: then
    test.sh alone must see to them), tests/ copied in, test.sh run from the workdir, the
    reward read (reward.json first, else reward.txt)."""
    verifier = box.workspace / "verifier"
    if clear and (verifier.is_symlink() or verifier.is_file()):
        verifier.unlink()
    for stale in ("reward.txt", "reward.json") if clear else ():
        (verifier / stale).unlink(missing_ok=True)
    await copy_in(box, task_dir(name) / "tests", "/tmp/tests")
    done = await box.exec(f"cd {WORKDIR} && /tmp/tests/test.sh > /tmp/test-stdout.txt 2>&1",
                          SCRIPT_TIMEOUT_S)
    log = await box.exec("cat /tmp/test-stdout.txt", SCRIPT_TIMEOUT_S)
    assert not done.timed_out, log.stdout[-2000:]
    if (verifier / "reward.json").is_file():
        rewards = json.loads((verifier / "reward.json").read_text())
        assert isinstance(rewards, dict) and "reward" in rewards, rewards
        return {key: float(value) for key, value in rewards.items()}
    assert (verifier / "reward.txt").is_file(), f"no reward written:\n{log.stdout[-2000:]}"
    return {"reward": float((verifier / "reward.txt").read_text())}


async def start(runtime: BubblewrapRuntime, name: str) -> Sandbox:
    """A sandbox as the family makes one for the task: its files, its workdir, its
    memory and storage from task.toml."""
    env = tomllib.loads((task_dir(name) / "task.toml").read_text())["environment"]
    limits = SandboxLimits(memory_mb=env["memory_mb"], disk_mb=env["storage_mb"])
    spec = SandboxSpec(files=environment_files(name), workspace_aliases=[WORKDIR, "/logs"], limits=limits)
    return await runtime.start(spec)


def test_there_are_at_least_eight_tasks():
    assert len(TASKS) >= 8, TASKS


@pytest.mark.parametrize("name", TASKS)
def test_the_layout_is_complete(name):
    task = task_dir(name)
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", name)
    for required in ("instruction.md", "task.toml", "environment/Dockerfile", "solution/solve.sh",
                     "tests/test.sh"):
        assert (task / required).is_file(), f"{name}: no {required}"
    instruction = (task / "instruction.md").read_text()
    assert len(instruction.split()) >= 30 and f"{WORKDIR}/" in instruction  # a real task text, at the workdir
    assert set(p.name for p in task.iterdir()) == {"instruction.md", "task.toml", "environment",
                                                   "solution", "tests"}
    for path in task.rglob("*"):
        relative = path.relative_to(task)
        assert not path.is_symlink(), f"{name}: {relative} is a link"
        assert not any(part.startswith(".") for part in relative.parts), f"{name}: {relative} is hidden"
        if path.is_file():
            path.read_text()  # text: the workspace is laid from text files
    for script in ("solution/solve.sh", "tests/test.sh"):
        text = (task / script).read_text()
        assert text.startswith("#!/bin/bash\n"), f"{name}: {script} has no bash shebang"
        assert (task / script).stat().st_mode & 0o111, f"{name}: {script} is not executable"
        # Their own files are found beside them, never at a fixed place.
        assert "/tests/" not in text.replace("/tmp/tests/", "") and "/solution/" not in text, script
    # The reward is written at the end of test.sh, nowhere earlier.
    lines = [line for line in (task / "tests/test.sh").read_text().splitlines() if line.strip()]
    writes = [i for i, line in enumerate(lines) if re.search(r"reward\.(txt|json)", line)
              and not line.lstrip().startswith(("rm ", "#"))]
    assert writes and min(writes) >= len(lines) - 12, f"{name}: the reward is written before the end"


@pytest.mark.parametrize("name", TASKS)
def test_task_toml_declares_what_the_family_maps(name):
    config = tomllib.loads((task_dir(name) / "task.toml").read_text())
    assert config["schema_version"] == SCHEMA_VERSION
    assert set(config) == {"schema_version", *SECTIONS}
    for section, allowed in SECTIONS.items():
        if allowed is not None:
            assert set(config[section]) <= allowed, f"{name}: [{section}] {set(config[section]) - allowed}"
    meta = config["metadata"]
    assert meta["author_name"] == "rollserve"
    assert meta["difficulty"] in {"easy", "medium", "hard"}
    assert isinstance(meta["category"], str) and meta["category"]
    assert meta["tags"] and all(isinstance(tag, str) and tag for tag in meta["tags"])
    assert 0 < config["agent"]["timeout_sec"] <= 3600
    assert 0 < config["verifier"]["timeout_sec"] <= 600
    env = config["environment"]
    assert env["network_mode"] == "no-network"  # Harbor's default is public: said, never left out
    assert env["workdir"] == WORKDIR
    for field in ("cpus", "memory_mb", "storage_mb"):
        assert isinstance(env[field], int) and env[field] > 0, field


@pytest.mark.parametrize("name", TASKS)
def test_the_dockerfile_builds_the_same_workspace(name):
    """Under Harbor with docker, the image's /app must hold what the workspace holds
    here: each entry beside the Dockerfile copied to the same place under /app, and
    the image (a Python image: python3, bash, coreutils; git, gcc and make in the full
    one) must have what the task needs."""
    env = task_dir(name) / "environment"
    lines = [line.strip() for line in (env / "Dockerfile").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    # Nothing but the image, the workdir and the files: no RUN (the host's system stands
    # in for the image under bubblewrap, where a RUN could not be honoured).
    assert lines[0].startswith("FROM python:3") and lines[1] == f"WORKDIR {WORKDIR}"
    assert all(line.startswith("COPY ") for line in lines[2:]), lines
    copies = {tuple(line.split()[1:]) for line in lines if line.startswith("COPY ")}
    entries = sorted(p.name for p in env.iterdir() if p.name != "Dockerfile")
    assert entries
    expected = {(e + "/" if (env / e).is_dir() else e, f"{WORKDIR}/{e}" + ("/" if (env / e).is_dir() else ""))
                for e in entries}
    assert copies == expected


@needs_bwrap
@pytest.mark.parametrize("name", TASKS)
async def test_the_oracle_solves_it_and_the_empty_agent_does_not(name, tmp_path):
    if missing := [program for program in NEEDS.get(name, ()) if shutil.which(program) is None]:
        pytest.skip(f"{name} needs {', '.join(missing)}, which this host lacks")
    runtime = BubblewrapRuntime(tmp_path / "state")
    async with await start(runtime, name) as box:
        await copy_in(box, task_dir(name) / "solution", "/tmp/solution")
        solved = await box.exec(f"cd {WORKDIR} && /tmp/solution/solve.sh", SCRIPT_TIMEOUT_S)
        assert solved.ok, solved.failure()
        rewards = await verify(box, name)
        assert all(value == 1.0 for value in rewards.values()), rewards
    async with await start(runtime, name) as box:
        # The empty agent, which also planted rewards where the verifier writes them; left
        # there, so that test.sh's own removal is what stands between them and the reward.
        planted = await box.exec("mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt && "
                                 "echo '{\"reward\": 1.0}' > /logs/verifier/reward.json", SCRIPT_TIMEOUT_S)
        assert planted.ok, planted.failure()
        rewards = await verify(box, name, clear=False)
        assert rewards["reward"] == 0.0, rewards


@needs_bwrap
@pytest.mark.parametrize("cheat", sorted(CHEATS))
async def test_an_obvious_cheat_scores_zero(cheat, tmp_path):
    name = cheat.split(":")[0]
    if missing := [program for program in NEEDS.get(name, ()) if shutil.which(program) is None]:
        pytest.skip(f"{name} needs {', '.join(missing)}, which this host lacks")
    runtime = BubblewrapRuntime(tmp_path / "state")
    async with await start(runtime, name) as box:
        tried = await box.exec(f"cd {WORKDIR} && {CHEATS[cheat]}", SCRIPT_TIMEOUT_S)
        assert tried.ok, tried.failure()
        assert (await verify(box, name))["reward"] == 0.0


def test_every_cheat_names_a_task():
    assert {cheat.split(":")[0] for cheat in CHEATS} == set(TASKS)  # one at least for each


# Tasks that need a program beyond a Debian host's base (the sandbox sees the host's).
NEEDS: dict[str, tuple[str, ...]] = {"make-incremental-build": ("cc", "make"), "git-bisect-revert": ("git",)}
