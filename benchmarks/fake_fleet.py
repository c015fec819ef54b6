"""Test-double vLLM servers in a process of their own, for the benchmarks.

The servers get their own process (and event loop), so the client being measured
shares nothing with them but the machine:

    with FakeFleet([{"latency": 0.05, "capacity": 8}, ...]) as fleet:
        fleet.urls   # one per server

    python -m benchmarks.fake_fleet '[{"latency": 0.05, "capacity": 8}]'
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys


class FakeFleet:
    def __init__(self, servers: list[dict], tokenizer: str = "smollm2"):
        self.servers = servers
        self.tokenizer = tokenizer
        self.urls: list[str] = []
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> FakeFleet:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.fake_fleet", json.dumps(self.servers), self.tokenizer],
            stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("urls "):
            self.proc.kill()
            raise RuntimeError(f"the fake fleet did not start: {line!r}")
        self.urls = line.split()[1:]
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid


async def _serve(servers: list[dict], tokenizer: str) -> None:
    from rollserve.testing import FakeVLLM

    fakes = [FakeVLLM(tokenizer, **{"replies": ["ok"], **spec}) for spec in servers]
    for fake in fakes:
        await fake.start()
    print("urls " + " ".join(f.url for f in fakes), flush=True)
    while True:
        await asyncio.sleep(3600)


if __name__ == "__main__":
    try:
        asyncio.run(_serve(json.loads(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "smollm2"))
    except KeyboardInterrupt:
        pass
