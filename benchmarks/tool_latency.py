"""Tool latency: 200 short shell commands through each way of driving a shell.

Methods, side by side, on the same commands (``echo hi``, ``ls``, ``cd /tmp && pwd``
in turn), each timed from "send the command" to "have its output and exit code":

- ``rollserve bash (bubblewrap)`` / ``(local)``: our BashSession on a PTY, event-driven.
- ``tmux, 0.5 s poll``: OpenHands' documented method (send-keys, then capture-pane
  every 0.5 s until the prompt marker shows). openhands-ai itself does not install
  on Python 3.11, so its method is reproduced here with the tmux CLI, as libtmux does.
- ``tmux, busy poll``: the same, polling capture-pane as fast as it returns.
- ``SWE-ReX BashSession``: ``swerex.runtime.local`` (pexpect), where swe-rex installs
  (``pip install 'rollserve[bench]'``).

    python -m benchmarks.tool_latency [--commands 200] [--poll-commands 200]

Targets: our median <= 1.5 ms, and >= 5x faster than busy-polled tmux.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable

from benchmarks.common import median, percentile, report, state_dir

COMMANDS = ["echo hi", "ls", "cd /tmp && pwd"]
WARMUP = 5


def commands(n: int) -> list[str]:
    return [COMMANDS[i % len(COMMANDS)] for i in range(n)]


async def time_each(run: Callable[[str], Awaitable[str]], n: int) -> list[float]:
    for command in commands(WARMUP):
        await run(command)
    times = []
    for command in commands(n):
        started = time.perf_counter()
        output = await run(command)
        times.append(time.perf_counter() - started)
        if command == "echo hi" and "hi" not in output:
            raise RuntimeError(f"wrong output for {command!r}: {output!r}")
    return times


# --- rollserve ---------------------------------------------------------------------------
async def rollserve_bash(runtime_name: str, n: int, state_dir: str) -> list[float]:
    from rollserve.sandbox.base import SandboxSpec
    from rollserve.sandbox.tools.bash import BashSession

    if runtime_name == "bubblewrap":
        from rollserve.sandbox.bubblewrap import BubblewrapRuntime

        reason = BubblewrapRuntime.unavailable_reason()
        if reason:
            raise RuntimeError(reason)
        runtime = BubblewrapRuntime(state_dir=state_dir)
    else:
        from rollserve.sandbox.local import LocalRuntime

        runtime = LocalRuntime(state_dir=state_dir)
    async with await runtime.start(SandboxSpec()) as sandbox, BashSession(sandbox) as shell:
        async def run(command: str) -> str:
            result = await shell.run(command)
            if result.exit_code != 0:
                raise RuntimeError(f"{command!r} failed: {result.to_text()}")
            return result.output

        return await time_each(run, n)


# --- tmux (OpenHands' method) -----------------------------------------------------------------
class Tmux:
    """A bash in a detached tmux session, driven through the tmux CLI like libtmux."""

    def __init__(self) -> None:
        self.socket = f"rollserve-bench-{uuid.uuid4().hex[:8]}"
        self.count = 0

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True,
                              text=True, check=True).stdout

    def start(self) -> None:
        self.tmux("-f", "/dev/null", "new-session", "-d", "-s", "bench", "-x", "250", "-y", "50",
                  "bash --norc --noprofile")
        self.tmux("send-keys", "-t", "bench", "-l", "export PS1='$ '; cd /tmp")
        self.tmux("send-keys", "-t", "bench", "Enter")

    def stop(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)

    def run(self, command: str, poll: float) -> str:
        # OpenHands puts the exit code in its PS1 and waits for it to show; a marker
        # unique per command plays that part (the typed line shows a literal "$?").
        self.count += 1
        marker = re.compile(rf"__DONE_{self.count}_(\d+)__")
        self.tmux("send-keys", "-t", "bench", "-l", f"{command}; echo __DONE_{self.count}_$?__")
        self.tmux("send-keys", "-t", "bench", "Enter")
        while True:
            if poll:
                time.sleep(poll)
            pane = self.tmux("capture-pane", "-p", "-J", "-t", "bench", "-S", "-50")
            if marker.search(pane):
                if self.count % 20 == 0:  # keep the scrollback small, as OpenHands clears it
                    self.tmux("clear-history", "-t", "bench")
                return pane


async def tmux_method(n: int, poll: float) -> list[float]:
    if shutil.which("tmux") is None:
        raise RuntimeError("tmux is not installed")
    session = Tmux()
    session.start()
    try:
        async def run(command: str) -> str:
            return session.run(command, poll)

        return await time_each(run, n)
    finally:
        session.stop()


# --- SWE-ReX ------------------------------------------------------------------------------------
async def swerex_method(n: int) -> list[float]:
    try:
        from swerex.runtime.abstract import BashAction, CreateBashSessionRequest
        from swerex.runtime.local import LocalRuntime
    except ImportError as error:
        raise RuntimeError(f"swe-rex is not installed (pip install 'rollserve[bench]'): {error}") from None
    runtime = LocalRuntime()
    await runtime.create_session(CreateBashSessionRequest(startup_timeout=10))
    try:
        async def run(command: str) -> str:
            observation = await runtime.run_in_session(BashAction(command=command, timeout=30, check="silent"))
            return observation.output

        return await time_each(run, n)
    finally:
        await runtime.close()


# --- main ---------------------------------------------------------------------------------------------
async def main(n: int, poll_n: int) -> None:
    state = state_dir()
    methods: list[tuple[str, int, Callable[[], Awaitable[list[float]]]]] = [
        ("rollserve bash (bubblewrap)", n, lambda: rollserve_bash("bubblewrap", n, state)),
        ("rollserve bash (local)", n, lambda: rollserve_bash("local", n, state)),
        ("SWE-ReX BashSession (local)", n, lambda: swerex_method(n)),
        ("tmux, busy poll", n, lambda: tmux_method(n, poll=0.0)),
        ("tmux, 0.5 s poll (OpenHands)", poll_n, lambda: tmux_method(poll_n, poll=0.5)),
    ]
    results: dict[str, dict] = {}
    for name, count, measure in methods:
        print(f"{name}: {count} commands ...", file=sys.stderr, flush=True)
        try:
            times = await measure()
        except Exception as error:  # a peer that does not install or run here: say so
            results[name] = {"skipped": f"{type(error).__name__}: {error}"}
            continue
        by_command = {c: median(times[i::len(COMMANDS)]) * 1e3 for i, c in enumerate(COMMANDS)}
        results[name] = {"commands": count, "median_ms": median(times) * 1e3,
                         "p95_ms": percentile(times, 95) * 1e3, "mean_ms": sum(times) / len(times) * 1e3,
                         "median_ms_by_command": by_command}
    results["OpenHands BashSession"] = {
        "skipped": "not installable on Python 3.11; see 'tmux, 0.5 s poll'"}

    ours = results["rollserve bash (bubblewrap)"]
    if "median_ms" not in ours:
        ours = results["rollserve bash (local)"]
    rows = []
    for name, r in results.items():
        if "median_ms" not in r:
            rows.append([name, "-", "-", "-", "-", "-", "-", "-", r["skipped"][:60]])
            continue
        ratio = r["median_ms"] / ours["median_ms"] if "median_ms" in ours else float("nan")
        r["ours_faster_by"] = ratio
        kinds = [r["median_ms_by_command"][c] for c in COMMANDS]
        rows.append([name, r["commands"], r["median_ms"], r["p95_ms"], *kinds, f"{ratio:.1f}x", ""])

    busy = results.get("tmux, busy poll", {})
    targets = {
        "our_median_ms": {"target": "<= 1.5", "measured": ours.get("median_ms"),
                          "met": ours.get("median_ms", 99) <= 1.5},
        "vs_busy_tmux": {"target": ">= 5x", "measured": busy.get("ours_faster_by"),
                         "met": (busy.get("ours_faster_by") or 0) >= 5},
    }
    report(
        "tool_latency",
        f"Shell tool latency: {n} short commands ({', '.join(COMMANDS)}), per command",
        ["method", "commands", "median ms", "p95 ms", *[f"{c} ms" for c in COMMANDS],
         "ours faster by", "note"],
        rows,
        {"config": {"commands": n, "poll_commands": poll_n, "mix": COMMANDS, "warmup": WARMUP},
         "results": results, "targets": targets},
    )
    for name, target in targets.items():
        print(f"target {name}: {target['target']}, measured {target['measured']}, "
              f"{'MET' if target['met'] else 'NOT MET'}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--commands", type=int, default=200)
    parser.add_argument("--poll-commands", type=int, default=200,
                        help="commands for the 0.5 s poll method (>= 0.5 s each)")
    args = parser.parse_args()
    asyncio.run(main(args.commands, args.poll_commands))
