"""Whole-service tests: a real `rollserve serve` process driven over HTTP."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import anthropic
import httpx
import httpx2
import pytest

from rollserve.contract import RolloutResult
from rollserve.testing import FakeVLLM


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`rollserve serve` in a child process, on a fixed port and state dir."""

    def __init__(self, state_dir: Path, args: list[str]):
        self.state_dir = state_dir
        self.port = free_port()
        self.args = args
        self.proc: subprocess.Popen | None = None
        self.log = state_dir / "server.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 180.0) -> "ServerProcess":
        # Returns as soon as /healthz answers; the bound only matters on a host so loaded
        # (load average 6+ on 2 cores) that a cold start of the server took over 60 s.
        return self.launch().wait_ready(timeout)

    def launch(self) -> "ServerProcess":
        """Start the process and return at once (``wait_ready`` waits for it): a test
        that needs several servers starts them side by side."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "rollserve.cli",
            "serve",
            "--port",
            str(self.port),
            "--state-dir",
            str(self.state_dir),
            "--log-level",
            "warning",
            *self.args,
        ]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        return self

    def wait_ready(self, timeout: float = 180.0) -> "ServerProcess":
        """Wait (at most ``timeout`` s from now) for the launched process's /healthz."""
        assert self.proc is not None, "launch() it first"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server did not start in {timeout}s: {self.log.read_text()[-2000:]}")

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, as in a crash or an OOM kill."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


@pytest.fixture
def server_factory(tmp_path):
    servers: list[ServerProcess] = []

    def make(*args: str, state_dir: Path | None = None) -> ServerProcess:
        server = ServerProcess(state_dir or tmp_path / "state", list(args))
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


@pytest.fixture
def fake_llm_thread():
    made = []

    def make(**kwargs) -> FakeVLLM:
        server = FakeVLLM("smollm2", **kwargs).start_in_thread()
        made.append(server)
        return server

    yield make
    for server in made:
        server.stop()


@pytest.fixture(autouse=True)
def _offline_env(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    os.environ.pop("ROLLSERVE_API_TOKEN", None)


# --- token-exactness against a test double's log ------------------------------------
def check_tokens(result: RolloutResult, calls: dict[tuple[int, ...], list[tuple[list[int], list[float]]]]) -> None:
    """Every sampled token is what the double answered to exactly that prompt."""
    tokens = result.trajectory.tokens
    ids, mask, logprobs = tokens.input_ids, tokens.loss_mask, tokens.logprobs
    assert len(ids) == len(mask) == len(logprobs)
    position = 0
    for turn in result.trajectory.turns:
        position += len(turn.prompt_ids_delta)
        n = len(turn.output_ids)
        sampled = (ids[position : position + n], logprobs[position : position + n])
        assert sampled == (turn.output_ids, turn.logprobs)
        assert sampled in calls[tuple(ids[:position])]
        assert mask[position : position + n] == [1] * n
        position += n
    assert position == len(ids)


def calls_by_prompt(fake: FakeVLLM) -> dict[tuple[int, ...], list[tuple[list[int], list[float]]]]:
    calls: dict[tuple[int, ...], list[tuple[list[int], list[float]]]] = {}
    for call in fake.calls:
        calls.setdefault(tuple(call.prompt_ids), []).append((call.output_ids, call.logprobs))
    return calls


def check_completed_as_sampled(results: list[RolloutResult], fake: FakeVLLM) -> None:
    """Each result completed, its tokens what ``fake`` sampled for exactly its prompts."""
    calls = calls_by_prompt(fake)
    for result in results:
        assert result.status == "completed", result.failure
        assert result.trajectory.fidelity.mismatches == 0
        check_tokens(result, calls)


@pytest.fixture
async def anthropic_for():
    """``anthropic_for(client, rollout_id)``: the rollout's key, and the official client
    pointed at its gateway the way ``ANTHROPIC_BASE_URL=<server>/v1/gateway/<key>``
    points it (over the same in-process app; the API key is anything, as a harness
    would set it). The clients are closed after the test."""
    opened: list[anthropic.AsyncAnthropic] = []

    async def make(client: httpx.AsyncClient, rollout_id: str) -> tuple[str, anthropic.AsyncAnthropic]:
        r = await client.get(f"/v1/rollouts/{rollout_id}/gateway", params={"wait": 60})
        assert r.status_code == 200, r.text
        key = r.json()["key"]
        http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=client._transport.app), timeout=30)
        harness = anthropic.AsyncAnthropic(
            base_url=f"http://rollserve/v1/gateway/{key}", api_key="anything", http_client=http, max_retries=0
        )
        opened.append(harness)
        return key, harness

    yield make
    for harness in opened:
        await harness.close()
