"""A stand-in for a rollserve server in the kill test: opens N sandboxes, each running
``sleep infinity``, registered under a state dir; prints one JSON line; waits forever.

    python -m tests.sandbox.owner_process <state_dir> <runtime> <n> [<options as JSON>]
"""

from __future__ import annotations

import asyncio
import json
import sys

from rollserve.sandbox.base import SandboxSpec
from rollserve.sandbox.config import runtime_config
from rollserve.sandbox.registry import get_runtime


async def main(state_dir: str, runtime_name: str, count: int, options: str = "{}") -> None:
    runtime = get_runtime(runtime_name, state_dir, runtime_config(runtime_name, json.loads(options)))
    sandboxes = [await runtime.start(SandboxSpec()) for _ in range(count)]
    for sandbox in sandboxes:
        await sandbox.spawn(["sleep", "infinity"])
    print(
        json.dumps({"ids": [s.id for s in sandboxes], "folders": [str(s.folders.base) for s in sandboxes]}), flush=True
    )
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), *sys.argv[4:5]))
