"""docs/ray.md's cluster recipe with Ray's own CLI (issue 12: "a new user can start a
1-head + N-worker cluster from the README", whose recipe is now that page's; the commands
are this file's own copy, with what one host standing in for three needs added, not read
from the page): `ray start --head --num-cpus 0` on
this host; two worker "machines", each a network namespace with its own address and
its own Ray session folders (`ip netns` and a private mount namespace: nothing of the
head's Ray session is visible there; the file system is otherwise shared), joined with
`ray start --address HEAD:PORT --resources '{"rollserve": N}' --labels
rollserve-node=NAME`; `rollserve serve --ray HEAD:PORT` on the head; the unchanged
client over HTTP. Token authentication is on, as docs/ray.md says to set it
(`RAY_AUTH_MODE=token` and one `RAY_AUTH_TOKEN` on every machine).

Needs root (network namespaces; CI runs as root); skipped otherwise.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import httpx
import psutil
import pytest

import rollserve
from rollserve.agent.tool_calls import format_tool_call
from rollserve.client import Client
from rollserve.contract import SamplingParams, TaskRequest
from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from rollserve.testing import FakeVLLM
from tests.e2e.conftest import ServerProcess
from tests.waiting import wait_until

pytest.importorskip("ray", reason="Ray is not installed (pip install 'rollserve[ray]')")


def _netns_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return "`ip` (iproute2) or `unshare` (util-linux) is missing"
    probe = f"rsq{os.getpid() % 100000}"
    steps = (["ip", "netns", "add", probe], ["ip", "link", "add", probe, "type", "veth", "peer", "name", f"{probe}p"])
    try:
        for step in steps:
            made = subprocess.run(step, capture_output=True, timeout=10)
            if made.returncode != 0:
                return f"`{' '.join(step[:3])}` failed: {made.stderr.decode(errors='replace').strip()}"
    finally:
        subprocess.run(["ip", "link", "del", probe], capture_output=True, timeout=10)
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=10)
    return None


_WHY_NOT = _netns_unavailable()
pytestmark = [
    pytest.mark.ray,
    pytest.mark.skipif(_WHY_NOT is not None, reason=str(_WHY_NOT)),
    pytest.mark.skipif(
        BubblewrapRuntime.unavailable_reason() is not None,
        reason=f"bubblewrap unavailable: {BubblewrapRuntime.unavailable_reason()}",
    ),
]

SLOTS = 4
BIN = Path(sys.executable).parent  # `ray` and `rollserve` as docs/ray.md's install puts them
TESTS = [{"input": "1 2\n", "output": "3\n"}]
SOLUTION = "a, b = map(int, input().split())\nprint(a + b)\n"


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, timeout=30)


class Machine:
    """A worker machine: a network namespace joined to the host by a veth pair (the
    host side is its gateway), whose processes see a /tmp of their own."""

    def __init__(self, index: int) -> None:
        pid = os.getpid()
        self.ns = f"rsx{pid}n{index}"
        self.host_if, self.ns_if = f"rsx{pid}h{index}", f"rsx{pid}p{index}"
        # This run's own addresses, in 198.18.0.0/15 (RFC 2544's benchmarking range: no
        # host or cloud network uses it, unlike 10/8, which a CI machine may sit in).
        subnet = f"198.{18 + pid // 250 % 2}.{pid % 250}"
        self.gateway, self.ip = f"{subnet}.{4 * index + 1}", f"{subnet}.{4 * index + 2}"

    def create(self) -> None:
        _run("ip", "netns", "add", self.ns)
        _run("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
        _run("ip", "link", "set", self.ns_if, "netns", self.ns)
        _run("ip", "addr", "add", f"{self.gateway}/30", "dev", self.host_if)
        _run("ip", "link", "set", self.host_if, "up")
        for cmd in (
            ["ip", "addr", "add", f"{self.ip}/30", "dev", self.ns_if],
            ["ip", "link", "set", self.ns_if, "up"],
            ["ip", "link", "set", "lo", "up"],
            ["ip", "route", "add", "default", "via", self.gateway],
        ):
            _run("ip", "netns", "exec", self.ns, *cmd)

    def start_ray(self, head: str, name: str, log: Path, temp_dir: str) -> subprocess.Popen[bytes]:
        """docs/ray.md's worker step, run inside this machine. Ray's session folders
        (the head's temp dir, which a joining node takes from the head, and Ray's
        default) are this machine's own: an empty file system mounted over each (the
        rest, the venv and the state dir included, is shared, like a shared home)."""
        private = " && ".join(f"mkdir -p {d} && mount -t tmpfs none {d}" for d in (temp_dir, "/tmp/ray"))
        join = (
            f"{private} && exec {BIN}/ray start --address {head} "
            f"--node-ip-address {self.ip} --resources '{{\"rollserve\": {SLOTS}}}' "
            f"--labels rollserve-node={name} --disable-usage-stats --block"
        )
        with log.open("ab") as out:
            return subprocess.Popen(
                ["ip", "netns", "exec", self.ns, "unshare", "-m", "--propagation", "private", "sh", "-c", join],
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def destroy(self) -> None:
        _remove_namespace(self.ns, self.host_if)


def _remove_namespace(ns: str, host_if: str) -> None:
    """Kill what runs in ``ns``, then remove it and the host's end of its veth pair."""
    pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=10).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass
    subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
    subprocess.run(["ip", "link", "del", host_if], capture_output=True, timeout=10)


def _remove_stale() -> None:
    """Namespaces an earlier run of this test left (its process is gone: killed before
    its teardown): they would hold addresses and processes."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout.split("\n")
    for line in listed:
        found = re.fullmatch(r"rsx(\d+)n(\d+)", line.split(" ")[0])
        if found and not psutil.pid_exists(int(found[1])):
            _remove_namespace(found[0], f"rsx{found[1]}h{found[2]}")


def _kill_matching(text: str) -> None:
    """Every process whose command line names ``text`` (the head's Ray temp dir)."""
    for proc in psutil.process_iter(["cmdline"]):
        if any(text in part for part in proc.info["cmdline"] or ()):
            try:
                proc.kill()
            except psutil.Error:
                pass


def _wait_started(log: Path, proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Until `ray start` says its node is up (as a user waits for the command to return)."""

    def started() -> bool:
        if "Ray runtime started" in log.read_text(errors="replace"):
            return True
        if proc.poll() is not None:
            raise RuntimeError(f"`ray start` exited with {proc.returncode}: {log.read_text(errors='replace')[-2000:]}")
        return False

    wait_until(started, timeout, "`ray start` to start its node", interval=0.3)


# An agent harness run inside the rollout's sandbox on a worker machine (the `gateway`
# family's `command`): it reaches its node worker's gateway through the socket bound
# into its workspace, as an OpenAI client would.
HARNESS = """
import json, os, urllib.request
body = json.dumps({"model": "p", "messages": [{"role": "user", "content": "[harness] 6*7?"}]})
request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions",
    data=body.encode(), headers={"Content-Type": "application/json",
                                 "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
with urllib.request.urlopen(request, timeout=60) as answer:
    print("harness got:", json.loads(answer.read())["choices"][0]["message"]["content"])
"""


def policy(prompt_ids: list[int], prompt: str) -> str:
    if "[harness]" in prompt:
        return "42"
    if "[code]" in prompt:
        if prompt.count("<|im_start|>assistant") > 1:
            return format_tool_call("submit", {})
        return format_tool_call(
            "str_replace_editor", {"command": "create", "path": "/workspace/solution.py", "file_text": SOLUTION}
        )
    return "The sum is \\boxed{4}."


def _restore_env(saved: dict[str, str | None]) -> None:
    """Put the environment variables back as ``saved`` (None: unset)."""
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="module")
def cli_cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("raycli")
    _remove_stale()
    machines = [Machine(i) for i in (1, 2)]
    head_ip, port = machines[0].gateway, 6400 + os.getpid() % 1000
    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "PYTHONPATH")}
    # One secret on every machine (docs/ray.md's step); the nodes import this checkout.
    os.environ.update(
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN=secrets.token_hex(32),
        PYTHONPATH=os.pathsep.join(
            p for p in (str(Path(rollserve.__file__).resolve().parents[1]), saved["PYTHONPATH"]) if p
        ),
    )
    temp_dir = str(tmp / "ray")
    procs: list[subprocess.Popen[bytes]] = []
    fake = FakeVLLM("smollm2", replies=policy, latency=0.01, host=head_ip)
    server: ServerProcess | None = None
    fake_started = False
    try:
        for m in machines:
            m.create()
        with (tmp / "head.log").open("ab") as out:
            procs.append(
                subprocess.Popen(
                    [
                        f"{BIN}/ray",
                        "start",
                        "--head",
                        "--node-ip-address",
                        head_ip,
                        "--port",
                        str(port),
                        "--num-cpus",
                        "0",
                        "--temp-dir",
                        temp_dir,
                        "--include-dashboard",
                        "false",
                        "--disable-usage-stats",
                        "--block",
                    ],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )
        _wait_started(tmp / "head.log", procs[0], timeout=240)
        for i, m in enumerate(machines, 1):  # one after the other, each once it is up
            log = tmp / f"worker{i}.log"
            procs.append(m.start_ray(f"{head_ip}:{port}", f"worker{i}", log, temp_dir))
            _wait_started(log, procs[-1], timeout=240)
        fake.start_in_thread()
        fake_started = True
        server = ServerProcess(tmp / "state", ["--ray", f"{head_ip}:{port}", "--backend", fake.url])
        server.start(timeout=240)

        def joined() -> bool:
            nodes = httpx.get(f"{server.url}/v1/status", timeout=10).json()["nodes"] or []
            return sum(n["alive"] for n in nodes) == len(machines)

        try:
            wait_until(joined, 180, "the worker machines to join", interval=0.5)
        except AssertionError as error:
            logs = "\n".join(p.read_text()[-1500:] for p in (*sorted(tmp.glob("*.log")), server.log))
            raise AssertionError(f"{error}\n{logs}") from None
        yield server, machines
    finally:
        # The environment first: the Ray token set above must not reach the tests after
        # this one (a Ray cluster they start would require a token nobody sends).
        _restore_env(saved)
        try:
            if server is not None and server.proc is not None:
                server.stop()
        finally:
            for m in machines:  # the worker machines first: nothing there may outlive the test
                m.destroy()
            for proc in procs:
                proc.kill()
                proc.wait(timeout=10)
            _kill_matching(temp_dir)
            if fake_started:
                fake.stop()


@pytest.mark.timeout(900)  # a loaded 2-core host starts three Ray nodes and their workers slowly
def test_readme_recipe_runs_rollouts_on_worker_machines(cli_cluster):
    server, machines = cli_cluster
    tasks = [
        TaskRequest(data_source="math", n=4, instance={"question": "What is 2 + 2?", "answer": "4"}) for _ in range(6)
    ]
    tasks += [
        TaskRequest(
            data_source="code",
            n=2,
            instance={"problem": f"[code] #{i}: print the sum of two integers.", "tests": TESTS},
        )
        for i in range(3)
    ]
    tasks += [
        TaskRequest(
            data_source="gateway",
            n=2,
            instance={"answer": "42", "files": {"harness.py": HARNESS}, "command": '"$ROLLSERVE_PYTHON" harness.py'},
        )
    ]
    with Client(server.url) as rs:
        accepted = rs.submit(tasks, sampling=SamplingParams(max_tokens=256))
        outcomes: Counter[tuple[str, str, float | None]] = Counter()
        for group in accepted.groups:
            view = rs.wait_group(group.group_id, timeout=240)
            for member in view.rollouts:
                result = member.result
                assert result is not None, f"rollout {member.id} has no result"
                outcomes[(result.data_source, result.status, result.reward)] += 1
                if result.data_source == "gateway":
                    assert result.evaluation is not None, (result.status, result.failure)
                    assert "harness got: 42" in result.evaluation["harness_log_tail"]
                    assert len(result.trajectory.turns) == 1
    # Every rollout ran to its end and was scored by its grader on a worker machine.
    assert outcomes == {
        ("math", "completed", 1.0): 24,
        ("code", "completed", 1.0): 6,
        ("gateway", "completed", 1.0): 2,
    }, outcomes
    nodes = {n["name"]: n for n in httpx.get(f"{server.url}/v1/status", timeout=10).json()["nodes"]}
    print("rollouts placed per worker machine:", {k: v["placed"] for k, v in nodes.items()})
    assert set(nodes) == {"worker1", "worker2"}
    for node in nodes.values():
        assert node["alive"] and node["slots"] == SLOTS
        assert node["placed"] > 0, f"{node['name']} got no rollout: {nodes}"
    assert sum(n["placed"] for n in nodes.values()) == 32

    # Nothing stays open on the machines once the batch is over (bounded wait: the head
    # polls the workers' sandbox counts every second).
    def closed() -> bool:
        nodes = httpx.get(f"{server.url}/v1/status", timeout=10).json()["nodes"]
        return all(n["hosted"] == 0 and n["sandboxes_open"] == 0 for n in nodes)

    wait_until(closed, 30, "nothing hosted or open on the machines", interval=0.5)
