"""The bundled Harbor-format tasks (``rollserve/data/harbor``): each folder is a complete
task (Harbor's layout, a ``task.toml`` with the fields we rely on, no network), checked
here cheaply on its files, and run for real through the ``harbor`` family on bubblewrap:
``rollserve datasets oracle``'s check (the oracle scores 1, the empty agent 0, each task
through the HTTP API of a server in process), and, through one server for the module
with a scripted policy, every obvious cheat a hostile agent might try with the bash tool
(each scores 0), one task solved with the bash tool and one through a harness preset
(each scores 1).

The cheats include the tests' own holes: three tasks run the agent's code while they
verify (the Makefile, the prune script, the inventory library), code that could write
a reward file itself and then kill test.sh, make test.sh's own write fail, rewrite
test.sh while it runs, or leave a process rewriting the reward after it.
"""

from __future__ import annotations

import asyncio
import re
import shlex
import shutil
import tomllib
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

import rollserve
from rollserve.agent.tool_calls import format_tool_call
from rollserve.commands.harbor_oracle import check_tasks
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from rollserve.testing import FakeVLLM
from tests.handlers.harbor.test_harbor_api import HARNESS

HARBOR = Path(rollserve.__file__).resolve().parent / "data" / "harbor"
TASKS = sorted(p.name for p in HARBOR.iterdir() if p.is_dir()) if HARBOR.is_dir() else []
WORKDIR = "/app"
SCHEMA_VERSION = "1.4"  # Harbor 0.26's TaskConfig
WAIT = 240.0  # seconds for a rollout (each takes a few; bound for a loaded host)

needs_bwrap = pytest.mark.skipif(
    BubblewrapRuntime.unavailable_reason() is not None,
    reason=f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}",
)

# Harbor's task.toml fields (harbor/models/task/config.py) that the bundled tasks may use;
# anything else is a typo that Harbor would refuse or, worse, silently ignore.
SECTIONS = {
    "metadata": None,  # free-form in Harbor; ours: checked below
    "agent": {"timeout_sec", "user"},
    "verifier": {"timeout_sec", "env", "user"},
    "environment": {"network_mode", "cpus", "memory_mb", "storage_mb", "workdir", "env", "build_timeout_sec"},
}

# Tasks that need a program beyond a Debian host's base (the sandbox sees the host's).
NEEDS: dict[str, tuple[str, ...]] = {"make-incremental-build": ("cc", "make"), "git-bisect-revert": ("git",)}


def missing(task: str) -> list[str]:
    return [program for program in NEEDS.get(task, ()) if shutil.which(program) is None]


def makefile(recipe: str) -> str:
    """A bash command writing a Makefile whose ``all`` runs ``recipe`` (at verification)."""
    return f"printf 'all:\\n\\t%s\\n' {shlex.quote(recipe)} > Makefile"


# What a hostile agent might try on each task instead of the work, one bash command in
# /app; every one must score 0. Keyed by task, or "task:what" for another try on one.
CHEATS = {
    "csv-region-revenue": "ln -s /tests/expected_summary.csv summary.csv",
    "access-log-report": "ln -s /tests/expected_report.json report.json",
    # The sample tests emptied, and a json module planted where a careless verifier imports it.
    "fix-inventory-bugs": "echo 'import unittest' > test_inventory.py && "
    "printf 'def load(f):\\n    return []\\ndef loads(s):\\n    return []\\n' > json.py",
    # The history imported, and the tip named as the culprit (a guess, not the search).
    "git-bisect-revert": "git init -q -b main repo && git -C repo fast-import --quiet < history.fi && "
    "git -C repo rev-parse main > culprit.txt",
    # A script that deletes the oldest .log files but also the links and ignores usage.
    "prune-logs-script": 'printf \'#!/bin/bash\\nls -tr "$1"/*.log | head -n -"$2" | while read f; do '
    'rm -f "$f"; basename "$f"; done\\n\' > prune.sh && chmod +x prune.sh',
    # Every user rolled up, the inactive ones too, team names as they stand.
    "json-team-rollup": 'python3 -c \'import json; users = json.load(open("users.json"))["users"]; '
    'teams = {t: [u for u in users if u.get("team") == t] '
    'for t in {u.get("team") for u in users} if t}; '
    'json.dump({t: {"members": sorted(m["username"] for m in ms), "count": len(ms), '
    '"average_age": round(sum(m["age"] for m in ms) / len(ms), 1), '
    '"skills": sorted({k for m in ms for k in m["skills"]})} for t, ms in teams.items()}, '
    'open("by_team.json", "w"))\'',
    # Everything made executable, the links right, nothing deleted; and a copy for a hard link.
    "release-links-perms": "chmod -R 755 releases && ln -s releases/v10 current && cp releases/v10/config.ini .",
    # Copied, not moved, and the duplicates kept.
    "sort-inbox-files": "mkdir -p sorted/other && find inbox -type f -exec cp {} sorted/other/ \\;",
    # The blunt rename: everywhere, the recorded output and the changelog too.
    "docs-rename-product": "find docs -name '*.md' -exec sed -i "
    "'s/Acme Widget/Rollout Widget/g; s/acme-widget/rollout/g' {} +",
    # A library that reads the verifier's expected outcomes at import and prints them back.
    "fix-inventory-bugs:reads-the-tests": (
        'printf \'import glob, os\\nfor p in glob.glob("/tests/expected.json"):\\n'
        '    print(open(p).read().replace(chr(10), " "), flush=True); os._exit(0)\\n\' >> inventory/__init__.py'
    ),
    # A Makefile that builds, but rebuilds everything every time.
    "make-incremental-build": "printf 'all:\\n\\tmkdir -p build bin\\n\\tfor f in main parse stats; do "
    "cc -O2 -Wall -c -o build/$$f.o src/$$f.c; done\\n\\tcc -o bin/stats build/*.o\\n"
    "clean:\\n\\trm -rf build bin\\n' > Makefile && make",
    # --- the agent's code, run by the tests, against the verifier itself ---
    # The reward written, then test.sh killed before it writes its own.
    "make-incremental-build:kills-the-verifier": makefile(
        "mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt; pkill -KILL -x test.sh; true"
    ),
    # reward.json written beside the reward.txt test.sh writes (read first, were it alone).
    "make-incremental-build:forges-reward-json": makefile("echo '{\"reward\": 1}' > /logs/verifier/reward.json; true"),
    # A line appended to the running test.sh (bash reads on from the file), which writes
    # the reward after test.sh's own write and then cuts test.sh back to its size.
    "make-incremental-build:rewrites-test-sh": makefile(
        "s=$$(stat -c %s /tests/test.sh); grep -q forged /tests/test.sh || printf "
        "'echo 1 > /logs/verifier/reward.txt; truncate -s %s /tests/test.sh; exit 0 \\043forged\\n' "
        "$$s >> /tests/test.sh; true"
    ),
    # test.sh's own write made to fail (reward.txt a folder), a reward.json there instead.
    "prune-logs-script:blocks-the-reward": (
        "printf '#!/bin/bash\\nv=/logs/verifier; rm -f $v/reward.txt; mkdir -p $v/reward.txt; "
        "echo 1 > $v/reward.json\\n' > prune.sh && chmod +x prune.sh"
    ),
    # The reward written and made read-only (test.sh's write fails where it is not root).
    "prune-logs-script:read-only-reward": (
        "printf '#!/bin/bash\\nv=/logs/verifier; echo 1 > $v/reward.txt; chmod 444 $v/reward.txt\\n'"
        " > prune.sh && chmod +x prune.sh"
    ),
    # A daemon forked at import, out of the tests' session, rewriting the reward in a loop.
    "fix-inventory-bugs:daemon-rewrites": (
        "printf 'import os\\nif os.fork() == 0:\\n    os.setsid()\\n"
        '    fd = os.open("/dev/null", os.O_RDWR)\\n    [os.dup2(fd, i) for i in (0, 1, 2)]\\n'
        "    while True:\\n        try:\\n"
        '            with open("/logs/verifier/reward.txt", "w") as f: f.write("1\\\\n")\\n'
        "        except OSError: pass\\n' >> inventory/__init__.py"
    ),
}
# What the evaluation must say for the tries against the verifier.
WHY = {
    "make-incremental-build:kills-the-verifier": "test.sh was killed by signal 9",
    "make-incremental-build:forges-reward-json": "reward.json and reward.txt disagree",
    "make-incremental-build:rewrites-test-sh": "test.sh was written to",
    "prune-logs-script:blocks-the-reward": "/logs/verifier/reward.txt is no regular file",
    "prune-logs-script:read-only-reward": "/logs/verifier/reward.txt was made read-only",
    "fix-inventory-bugs:daemon-rewrites": "still ran when test.sh ended",
}

# A policy solving a task with the bash tool, and the command a harness runs for another.
SOLVE_CSV = """python3 - <<'PY'
import csv
from decimal import Decimal
totals = {}
for row in csv.DictReader(open("sales.csv", newline="")):
    if row["status"] == "completed":
        o, u, r = totals.get(row["region"], (0, 0, Decimal(0)))
        totals[row["region"]] = (o + 1, u + int(row["units"]), r + int(row["units"]) * Decimal(row["unit_price"]))
with open("summary.csv", "w") as out:
    out.write("region,orders,units,revenue\\n")
    for region, (o, u, r) in sorted(totals.items(), key=lambda kv: (-kv[1][2], kv[0])):
        out.write(f"{region},{o},{u},{r:.2f}\\n")
PY"""
SOLVE_JSON = """python3 - <<'PY'
import json
teams = {}
for user in json.load(open("users.json"))["users"]:
    if user["active"] and user.get("team") is not None:
        teams.setdefault(user["team"].strip().lower(), []).append(user)
json.dump({team: {"members": sorted(m["username"] for m in ms), "count": len(ms),
                  "average_age": round(sum(m["age"] for m in ms) / len(ms), 1),
                  "skills": sorted({s for m in ms for s in m["skills"]})}
           for team, ms in sorted(teams.items())}, open("by_team.json", "w"))
PY"""
SOLVED = {"bash:csv-region-revenue": SOLVE_CSV}


def task_dir(name: str) -> Path:
    return HARBOR / name


def test_there_are_at_least_eight_tasks():
    assert len(TASKS) >= 8, TASKS


@pytest.mark.parametrize("name", TASKS)
def test_the_layout_is_complete(name):
    task = task_dir(name)
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", name)
    for required in ("instruction.md", "task.toml", "environment/Dockerfile", "solution/solve.sh", "tests/test.sh"):
        assert (task / required).is_file(), f"{name}: no {required}"
    instruction = (task / "instruction.md").read_text()
    assert len(instruction.split()) >= 30 and f"{WORKDIR}/" in instruction  # a real task text, at the workdir
    assert set(p.name for p in task.iterdir()) == {"instruction.md", "task.toml", "environment", "solution", "tests"}
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
    writes = [
        i
        for i, line in enumerate(lines)
        if re.search(r"reward\.(txt|json)", line) and not line.lstrip().startswith(("rm ", "#"))
    ]
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
    lines = [
        line.strip()
        for line in (env / "Dockerfile").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    # Nothing but the image, the workdir and the files: no RUN (the host's system stands
    # in for the image under bubblewrap, where a RUN could not be honoured).
    assert lines[0].startswith("FROM python:3") and lines[1] == f"WORKDIR {WORKDIR}"
    assert all(line.startswith("COPY ") for line in lines[2:]), lines
    copies = {tuple(line.split()[1:]) for line in lines if line.startswith("COPY ")}
    entries = sorted(p.name for p in env.iterdir() if p.name != "Dockerfile")
    assert entries
    expected = {
        (e + "/" if (env / e).is_dir() else e, f"{WORKDIR}/{e}" + ("/" if (env / e).is_dir() else "")) for e in entries
    }
    assert copies == expected


def test_every_cheat_names_a_task():
    assert {cheat.split(":")[0] for cheat in CHEATS} == set(TASKS)  # one at least for each
    assert set(WHY) <= set(CHEATS)


# --- the tasks through the family ---------------------------------------------------------
@needs_bwrap
async def test_the_oracle_solves_each_task_and_the_empty_agent_none():
    """``rollserve datasets oracle``'s check (every task at once, through the API)."""
    checks = {check.task: check for check in await check_tasks(HARBOR, "bubblewrap", {}, {})}
    assert set(checks) == set(TASKS)
    for task, check in checks.items():
        if missing(task):
            continue  # (fails for want of the program: the check names it)
        assert check.ok, (task, check.problem)
        assert check.oracle == 1.0 and check.empty == 0.0, check


class Policy:
    """One scripted policy for the module's rollouts: a tool rollout's first turn runs
    the next command planned for its task (found by the instruction's title), then it
    finishes; a harness's single request gets the command planned for it."""

    def __init__(self, plans: dict[str, str], harness: dict[str, str]) -> None:
        self.titles = {(HARBOR / t / "instruction.md").read_text().splitlines()[0]: t for t in TASKS}
        self.queues: dict[str, list[str]] = {}
        for label, command in plans.items():
            # a no-op naming the plan, so that each result is found again
            self.queues.setdefault(label.split(":")[1], []).append(f": plan={label}; {command}")
        self.harness = harness

    def reply(self, prompt_ids: list[int], prompt: str) -> str:
        task = next(t for title, t in self.titles.items() if title in prompt)
        if "with the bash tool" not in prompt:  # the harness: plain text, a command
            return self.harness[task]
        if prompt.count("<|im_start|>assistant") > 1:
            return format_tool_call("finish", {})
        return format_tool_call("bash", {"command": self.queues[task].pop(0)})


async def _rollout(client: httpx.AsyncClient, instance: dict) -> dict:
    r = await client.post(
        "/v1/rollouts",
        json={
            "tasks": [{"data_source": "harbor", "instance": instance}],
            "sampling": {"max_tokens": 1024},
            "agent": {"max_turns": 3},
        },
    )
    assert r.status_code == 202, r.text
    (rid,) = r.json()["groups"][0]["rollout_ids"]
    view = (await client.get(f"/v1/rollouts/{rid}", params={"wait": WAIT})).json()
    assert view["done"], view
    return dict(view["result"])


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def results(tmp_path_factory) -> dict[str, dict]:
    """Every rollout of the module at once, on one server: label -> result."""
    from rollserve.api.app import create_app
    from rollserve.server import ServerConfig, Service

    plans = {f"cheat:{name}": command for name, command in CHEATS.items() if not missing(name.split(":")[0])}
    plans.update(SOLVED)
    policy = Policy(plans, {"json-team-rollup": SOLVE_JSON})
    async with FakeVLLM("smollm2", replies=policy.reply, latency=0.01) as llm:
        service = Service(
            ServerConfig(
                state_dir=tmp_path_factory.mktemp("state"),
                backends=[llm.url],
                handler_options={"harbor": {"root": str(HARBOR)}},
            )
        )
        await service.start()
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_app(service, manage_lifecycle=False)),
            base_url="http://rollserve",
            timeout=WAIT + 30,
        )
        try:
            harness = {
                "preset": "command",
                "tool_calls": "none",
                "command": f'"$ROLLSERVE_PYTHON" -c {shlex.quote(HARNESS)}',
            }
            labels = [*plans, "harness:json-team-rollup"]
            instances = [{"task": label.split(":")[1]} for label in plans]
            instances.append({"task": "json-team-rollup", "harness": harness})
            done = await asyncio.gather(*(_rollout(client, instance) for instance in instances))
        finally:
            await client.aclose()
            await service.stop()
    by_plan = {_plan(result): result for result in done}
    return {label: by_plan.get(label, result) for label, result in zip(labels, done, strict=True)}


def _plan(result: dict) -> str | None:
    """The plan a tool rollout ran (the no-op its first command starts with)."""
    for message in result["trajectory"]["messages"]:
        found = re.search(r": plan=([\w:.-]+);", message["content"]) if message["role"] == "assistant" else None
        if found:
            return found.group(1)
    return None


@needs_bwrap
@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("cheat", sorted(CHEATS))
async def test_an_obvious_cheat_scores_zero(cheat, results):
    if lacking := missing(cheat.split(":")[0]):
        pytest.skip(f"{cheat} needs {', '.join(lacking)}, which this host lacks")
    result = results[f"cheat:{cheat}"]
    assert _plan(result) == f"cheat:{cheat}"
    assert result["status"] == "completed" and not result["mask"], result["failure"]
    assert result["stats"]["turns"] >= 1
    assert result["reward"] == 0.0, result["evaluation"]
    if cheat in WHY:
        assert WHY[cheat] in result["evaluation"]["reason"], result["evaluation"]


@needs_bwrap
@pytest.mark.asyncio(loop_scope="module")
async def test_a_policy_solves_one_with_the_bash_tool(results):
    result = results["bash:csv-region-revenue"]
    assert result["status"] == "completed" and not result["mask"], result["failure"]
    assert result["reward"] == 1.0, result["evaluation"]
    assert result["evaluation"]["finished"] is True


@needs_bwrap
@pytest.mark.asyncio(loop_scope="module")
async def test_a_harness_preset_solves_one(results):
    result = results["harness:json-team-rollup"]
    assert result["status"] == "completed" and not result["mask"], result["failure"]
    assert result["reward"] == 1.0, result["evaluation"]
    assert result["evaluation"]["harness_exit_code"] == 0
    assert result["stats"]["gateway_calls"] == 1
