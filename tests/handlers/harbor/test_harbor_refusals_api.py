"""Task folders this server cannot run are refused at submit through the HTTP API (422),
naming the problem: malformed folders, paths out of the root, task.toml fields that
cannot be honoured here, Dockerfiles that need an image on bubblewrap."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tarfile
from pathlib import Path

import httpx
import pytest

from rollserve.handlers.harbor import folder as task_folder
from rollserve.handlers.harbor import instances
from tests.handlers.harbor.test_harbor_api import DATA, options

BASE = DATA / "count-words"


def _toml(extra: str, replace: tuple[str, str] | None = None):
    def change(folder: Path) -> None:
        path = folder / "task.toml"
        text = path.read_text()
        if replace:
            text = text.replace(*replace)
        path.write_text(text + "\n" + extra)

    return change


def _remove(name: str):
    return lambda folder: os.remove(folder / name)


def _write(name: str, text: str):
    def change(folder: Path) -> None:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)

    return change


def _symlink(folder: Path) -> None:
    (folder / "environment" / "input" / "leak.txt").symlink_to("/etc/passwd")


CASES = {
    "missing-test": (_remove("tests/test.sh"), "tests/test.sh: missing"),
    "missing-instruction": (_remove("instruction.md"), "instruction.md: missing"),
    "bad-toml": (_write("task.toml", "schema_version = \n"), "task.toml: not valid TOML"),
    "unknown-version": (
        _toml("", ('schema_version = "1.4"', 'schema_version = "9.9"')),
        "unknown schema_version '9.9'",
    ),
    "unknown-field": (_toml("[environment2]\nx = 1\n"), "environment2"),
    "symlink": (_symlink, "environment/input/leak.txt: a symlink"),
    "steps": (_write("steps/one/instruction.md", "x"), "steps: multi-step"),
    "mcp": (_toml('[[environment.mcp_servers]]\nname = "x"\nurl = "http://x"\n'), "environment.mcp_servers"),
    "gpus": (_toml("", ("cpus = 1", "cpus = 1\ngpus = 1")), "environment.gpus"),
    "windows": (_toml("", ("cpus = 1", 'cpus = 1\nos = "Windows"')), "environment.os"),
    "separate-verifier": (
        _toml("", ("[verifier]", '[verifier]\nenvironment_mode = "separate"')),
        "verifier.environment_mode",
    ),
    "artifacts": (_toml("", ('source = "rollserve tests"', 'source = "x"\nartifacts = ["/app"]')), "artifacts"),
    "allowlist": (
        _toml("", ('network_mode = "no-network"', 'network_mode = "allowlist"\nallowed_hosts = ["pypi.org"]')),
        "environment.allowed_hosts",
    ),
    "user": (_toml("", ("[agent]", '[agent]\nuser = "root"')), "agent.user"),
    "host-env": (_toml("", ('EXPECTED_FILE = "/tests/expected.txt"', 'TOKEN = "${HOME}"')), "verifier.env.TOKEN"),
    "image-on-bubblewrap": (
        _toml("", ("cpus = 1", 'cpus = 1\ndocker_image = "ubuntu:24.04"')),
        "environment.docker_image",
    ),
    "dockerfile-run": (
        _write("environment/Dockerfile", "FROM ubuntu\nWORKDIR /app\nRUN apt-get install -y jq\n"),
        "line 3: RUN is not supported",
    ),
    "copy-outside": (
        _write("environment/Dockerfile", "FROM ubuntu\nWORKDIR /app\nCOPY input /etc/input\n"),
        "outside the workdir",
    ),
    "copy-escape": (
        _write("environment/Dockerfile", "FROM ubuntu\nWORKDIR /app\nCOPY ../tests/expected.txt /app/x\n"),
        "COPY ../tests/expected.txt: outside",
    ),
    "copy-missing": (
        _write("environment/Dockerfile", "FROM ubuntu\nWORKDIR /app\nCOPY nothing.txt /app/x\n"),
        "COPY nothing.txt: no such file",
    ),
    "memory": (_toml("", ("memory_mb = 1024", "memory_mb = 999999")), "environment.memory_mb"),
    # Harbor's older size strings: one no integer holds is the field's 422, not a server error
    "memory-overflow": (_toml("", ("memory_mb = 1024", 'memory = "1e400G"')), "task.toml: environment"),
    "memory-inf": (_toml("", ("memory_mb = 1024", 'memory = "infG"')), "finite number"),
    "workdir-shell": (_toml("", ('workdir = "/app"', 'workdir = "/app;touch x"')), "task.toml: environment.workdir"),
    "workdir-space": (_toml("", ('workdir = "/app"', 'workdir = "/my app"')), "task.toml: environment.workdir"),
}


@pytest.fixture
def root(tmp_path) -> Path:
    root = tmp_path / "tasks"
    for name, (change, _) in CASES.items():
        shutil.copytree(BASE, root / name)
        change(root / name)
    shutil.copytree(BASE, root / "archived")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(root / "archived", arcname="archived")
    (root / "archived.tar.gz").write_bytes(buffer.getvalue())
    with tarfile.open(root / "escape.tar", mode="w") as tar:
        info = tarfile.TarInfo("task/../../x")
        tar.addfile(info, io.BytesIO(b""))
    shutil.copytree(BASE, tmp_path / "outside")
    (root / "linked").symlink_to(tmp_path / "outside")
    return root


async def test_malformed_and_unsupported_tasks_are_4xx_naming_the_problem(make_api, root):
    service, client = await make_api([], server=options(root))

    async def refusal(task: str) -> str:
        r = await client.post("/v1/rollouts", json={"tasks": [{"data_source": "harbor", "instance": {"task": task}}]})
        assert r.status_code == 422, (task, r.text)
        error = r.json()["errors"][0]
        assert error["field"].endswith("instance.task"), (task, error)
        return error["message"]

    for name, (_, expected) in CASES.items():
        message = await refusal(name)
        assert expected in message, (name, message)
    for escaping in ("../outside", "linked", str(root.parent / "outside"), "escape.tar"):
        message = await refusal(escaping)
        assert "out of the server's harbor root" in message or "archive" in message, message
    assert "dataset folder" in await refusal(".")
    assert "not a usable path" in await refusal("a\u0000b")
    assert "not a usable path" in await refusal("x" * 4000)
    # the same task, archived, is admitted; so is the folder itself
    for good in ("archived.tar.gz", "archived"):
        r = await client.post("/v1/rollouts", json={"tasks": [{"data_source": "harbor", "instance": {"task": good}}]})
        assert r.status_code == 202, (good, r.text)
        await client.delete(f"/v1/groups/{r.json()['groups'][0]['group_id']}")


async def test_an_archive_is_unpacked_once_by_content_across_restarts(make_api, root):
    """The unpacked copy is named by the archive's content: a server started again finds
    it (one copy per content in the cache, never one per start)."""
    digest = hashlib.sha256((root / "archived.tar.gz").read_bytes()).hexdigest()[:32]
    for _ in range(2):  # two servers, one after the other: a restart
        instances._UNPACKED.clear()  # (what a new process remembers)
        _, client = await make_api([], server=options(root))
        r = await client.post(
            "/v1/rollouts", json={"tasks": [{"data_source": "harbor", "instance": {"task": "archived.tar.gz"}}]}
        )
        assert r.status_code == 202, r.text
        await client.delete(f"/v1/groups/{r.json()['groups'][0]['group_id']}")
    copies = sorted(p.name for p in instances.cache_folder().iterdir() if p.name.startswith(digest))
    assert copies == [digest], copies


async def test_a_task_is_loaded_once_and_again_when_it_changes(make_api, root, monkeypatch):
    """Submit checks a task on the event loop: a task seen before, unchanged, is not
    walked again (a few stats); a change to its task.toml is seen at the next submit."""
    loads = []
    real = task_folder.load_task
    monkeypatch.setattr(task_folder, "load_task", lambda path: loads.append(path) or real(path))
    _, client = await make_api([], server=options(root))

    async def post() -> httpx.Response:
        return await client.post(
            "/v1/rollouts", json={"tasks": [{"data_source": "harbor", "instance": {"task": "archived"}}]}
        )

    for _ in range(3):
        r = await post()
        assert r.status_code == 202, r.text
        await client.delete(f"/v1/groups/{r.json()['groups'][0]['group_id']}")
    assert len(loads) == 1, loads
    _toml("", ("memory_mb = 1024", "memory_mb = 999999"))(root / "archived")
    r = await post()
    assert r.status_code == 422 and "environment.memory_mb" in r.text, r.text
    assert len(loads) == 2, loads
