"""`rollserve quickstart` on a scripted backend (`--backend URL`, no model): its table per
data_source against the results it wrote, `--keep-serving` (the API answers after the
batch; SIGINT stops it cleanly, exit 0), and a SIGTERM in the middle of a batch (exit
130, no process or sandbox left)."""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from rollserve.sandbox.bubblewrap import BubblewrapRuntime
from tests.waiting import wait_until

from .conftest import free_port

READY = "Ctrl-C to stop"


def scripted(prompt_ids: list[int], prompt: str) -> str:
    """Right on the first easy row (3 + 4: B) and the first math row (7 + 5 = 12), wrong
    on the second easy row (the flying animal is A); always in the asked format."""
    if "7 + 5" in prompt:
        return "Adding: \\boxed{12}"
    return "B"


class Quickstart:
    """The quickstart in a child process; its stderr read line by line on a thread."""

    def __init__(self, tmp_path: Path, *args: str, port: int | None = None) -> None:
        self.port = port or free_port()
        self.out = tmp_path / "results.jsonl"
        self.state_dir = tmp_path / "state"
        env = {**os.environ, "COLUMNS": "200"}  # rich's table on one line per row
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rollserve.cli",
                "quickstart",
                "--port",
                str(self.port),
                "--out",
                str(self.out),
                "--state-dir",
                str(self.state_dir),
                *args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def wait_for(self, needle: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.text:
            assert self.proc.poll() is None, f"exited {self.proc.returncode}: {self.text[-3000:]}"
            assert time.monotonic() < deadline, f"no {needle!r} in {timeout}s: {self.text[-3000:]}"
            time.sleep(0.1)

    def descendants(self) -> list[psutil.Process]:
        return psutil.Process(self.proc.pid).children(recursive=True)

    def finish(self, timeout: float = 90.0) -> int:
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def quickstart(tmp_path):
    made: list[Quickstart] = []

    def make(*args: str, port: int | None = None) -> Quickstart:
        made.append(Quickstart(tmp_path, *args, port=port))
        return made[-1]

    yield make
    for q in made:
        q.kill()


def table_rows(text: str) -> dict[str, list[str]]:
    """The summary table's rows by data_source: its cells, as printed (no cell has a space)."""
    rows = {}
    for line in text.splitlines():
        cells = line.split()
        if len(cells) == 10 and cells[0] in ("stem", "math", "code"):
            rows[cells[0]] = cells
    return rows


def gone(processes: list[psutil.Process], timeout: float = 15.0) -> list[psutil.Process]:
    """Those of ``processes`` still alive after ``timeout`` seconds."""
    _, alive = psutil.wait_procs(processes, timeout=timeout)
    return alive


def test_table_per_data_source_and_keep_serving_until_sigint(tmp_path, quickstart, fake_llm_thread):
    llm = fake_llm_thread(replies=scripted)
    q = quickstart(
        "--backend",
        llm.url,
        "--easy-tasks",
        "2",
        "--tasks",
        "1",
        "--code-tasks",
        "0",
        "--n",
        "2",
        "--seed",
        "7",
        "--keep-serving",
    )
    q.wait_for(READY, timeout=240)

    # The batch is over and the server still answers.
    base = f"http://127.0.0.1:{q.port}"
    status = httpx.get(f"{base}/v1/status", timeout=10).json()
    assert status["in_flight"] == 0 and status["finished"] == {"completed": 6}
    assert httpx.get(f"{base}/v1/results", params={"limit": 100}, timeout=10).json()["results"]
    assert f"dashboard: {base}/ui" in q.text

    # The table: one row per data_source, as the written results add up.
    results = [json.loads(line) for line in q.out.read_text().splitlines()]
    assert sorted(r["metadata"]["seed"] for r in results) == list(range(7, 13))  # one each
    assert {r["data_source"] for r in results} == {"stem", "math"}
    rows = table_rows(q.text)
    assert set(rows) == {"stem", "math"}, q.text[-3000:]
    for source, (mean, passed, n) in {"stem": ("0.500", "2/4", "4"), "math": ("1.000", "2/2", "2")}.items():
        mine = [r for r in results if r["data_source"] == source]
        rewards = [r["reward"] for r in mine if not r["mask"]]
        assert f"{statistics.fmean(rewards):.3f}" == mean
        assert f"{sum(x >= 1.0 for x in rewards)}/{len(rewards)}" == passed
        cells = rows[source]
        assert (cells[1], cells[2], cells[3], cells[4]) == (n, "0", mean, passed), cells

    # A dashboard left open: an event stream that never ends by itself.
    streaming = threading.Event()

    def listen() -> None:
        try:
            with httpx.stream("GET", f"{base}/v1/events", timeout=httpx.Timeout(10, read=None)) as r:
                streaming.set()
                for _ in r.iter_bytes():
                    pass
        except httpx.HTTPError:
            pass  # the server went away: expected

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    assert streaming.wait(30)

    children = q.descendants()
    q.proc.send_signal(signal.SIGINT)
    assert q.finish() == 0, q.text[-3000:]
    listener.join(timeout=10)
    assert not listener.is_alive()
    assert "stopping" in q.text and "Traceback" not in q.text
    assert gone(children) == []
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{base}/healthz", timeout=2)


@pytest.mark.skipif(BubblewrapRuntime.unavailable_reason() is not None, reason="needs bubblewrap sandboxes")
def test_sigterm_mid_batch_stops_cleanly_leaving_no_sandbox(tmp_path, quickstart, fake_llm_thread):
    """The code agent's sandbox is open while the slow policy thinks; SIGTERM then: the
    quickstart says it stopped, exits 130, and leaves no process and no sandbox."""
    llm = fake_llm_thread(replies=["Let me look at the files first."], latency=60.0)
    q = quickstart("--backend", llm.url, "--easy-tasks", "0", "--tasks", "0", "--code-tasks", "1", "--n", "1")
    base = f"http://127.0.0.1:{q.port}"

    def sandbox_open() -> bool:
        assert q.proc.poll() is None, q.text[-3000:]
        try:
            return httpx.get(f"{base}/v1/status", timeout=5).json()["sandboxes"]["open"] >= 1
        except httpx.HTTPError:
            return False

    wait_until(sandbox_open, 240, "the rollout in RUN with its sandbox open", interval=0.2)
    children = q.descendants()  # the scoring pool's workers, and the sandbox's if any
    records = q.state_dir / "sandboxes"  # an owner record per sandbox not yet removed
    assert list(records.iterdir())
    q.proc.send_signal(signal.SIGTERM)
    assert q.finish() == 130, q.text[-3000:]
    assert "stopped" in q.text and "Traceback" not in q.text
    assert gone(children) == []
    assert list(records.iterdir()) == []


def test_a_taken_port_is_a_clear_error_before_anything_starts(tmp_path, quickstart, fake_llm_thread):
    """The API's socket is bound first: a taken --port is one line naming the port (exit
    2), not a traceback from inside the HTTP server after the service started."""
    llm = fake_llm_thread(replies=scripted)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        q = quickstart("--backend", llm.url, "--easy-tasks", "1", "--tasks", "0", "--code-tasks", "0", port=port)
        assert q.finish(timeout=60) == 2, q.text[-3000:]
    assert f"port {port}" in q.text and "in use" in q.text, q.text[-3000:]
    assert "Traceback" not in q.text, q.text[-3000:]
    assert not llm.calls  # nothing started: no backend was asked anything
