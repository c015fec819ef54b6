"""Tool-call capacity: many concurrent sessions, each making bash tool calls for a fixed time.

Each session is what a tool-using rollout holds during RUN: a bubblewrap sandbox (the
server runtime's default spec, so its caps' watchers run as in a rollout) and a
``ToolEnv`` with the ``bash`` tool. A session loops: one assistant reply with a Hermes
``<tool_call>`` block for a cheap command, ``ToolEnv.step`` (parse, check, run the
command in the sandbox's shell, the tool message back), its output checked. No model
is asked: what is measured is the tool path alone, every session driving it as fast
as it answers. The commands cycle through ``ls``, ``cat hello.txt`` (two fork/execs
inside the sandbox) and ``echo hi`` (a shell builtin).

Reported per path: calls/s over the window, p50/p99 per call, CPU per call of the
server process (user + system: the event loop and its threads), of the sandboxes'
processes (their shells and the commands the shells reaped, from /proc) and of the
whole machine (every process, other users' included: the machine may be shared), and
the calls/s the cores could make at the server's and the sandboxes' CPU per call
(``CPU-bound``). Then, alone on one idle shell, what ``ls`` costs over the builtin
``echo``: the fork/exec a call like ``ls`` needs inside the sandbox.

Paths, side by side in one run (each over fresh sessions):

- ``per-sandbox pollers``: every sandbox's disk and memfd watchers each wake 4 times a
  second to read the host's filesystem usage and /proc/meminfo (the old path);
- ``shared tick``: one ticker per event loop reads each once per tick for every
  watcher (the new path, sandbox/watch.py's ``Ticker``).

    python -m benchmarks.tool_calls [--sessions 200] [--seconds 20] [--paths old,new]

Target: >= 1,000 calls/s at 200 sessions on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import time

from benchmarks.common import median, percentile, report, state_dir

COMMANDS = [("ls", "hello.txt"), ("cat hello.txt", "hello"), ("echo hi", "hi")]
REPLIES = [
    (f'<tool_call>{{"name": "bash", "arguments": {{"command": "{command}"}}}}</tool_call>', expect)
    for command, expect in COMMANDS
]


def machine_cpu() -> float:
    """CPU seconds every process of the machine has used (``/proc/stat``, all cores)."""
    with open("/proc/stat") as stat:
        fields = stat.readline().split()[1:]
    ticks = sum(int(v) for i, v in enumerate(fields) if i not in (3, 4))  # not idle, iowait
    return ticks / os.sysconf("SC_CLK_TCK")


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def tree_cpu(sandboxes) -> float:
    """CPU seconds the sandboxes' processes have used: each live process's own and its
    reaped children's (a shell's ``ls`` and ``cat``), from ``/proc/PID/stat``."""
    from rollserve.sandbox.proctree import tree_pids

    ticks = 0
    for sandbox in sandboxes:
        for pid in tree_pids(sandbox.root_pids()):
            try:
                with open(f"/proc/{pid}/stat") as stat:
                    fields = stat.read().rpartition(")")[2].split()
            except OSError:
                continue
            ticks += sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


HOSTILE = {
    "flood": "yes",  # prints until the flood limit (64 MB) interrupts it
    "fork": ":(){ :|:& };:",  # forks until the sandbox's process limit, and goes on
}


class Session:
    def __init__(self, runtime, spec, hostile: str | None = None) -> None:
        self.runtime, self.spec, self.hostile = runtime, spec, hostile
        self.times: list[float] = []
        self.bad = 0

    async def open(self) -> None:
        from rollserve.agent.sandbox_tools import BashTool
        from rollserve.agent.tool_env import ToolEnv

        self.sandbox = await self.runtime.start(self.spec)
        self.env = ToolEnv([BashTool(self.sandbox)], "bench")
        await self.call(0, record=False)  # the shell starts at the first call: not timed

    async def call(self, n: int, record: bool = True) -> None:
        if self.hostile is not None and record:
            command = HOSTILE[self.hostile]
            await self.env.step(f'<tool_call>{{"name": "bash", "arguments": {{"command": "{command}"}}}}</tool_call>')
            return
        reply, expect = REPLIES[n % len(REPLIES)]
        started = time.perf_counter()
        step = await self.env.step(reply)
        took = time.perf_counter() - started
        text = str(step.messages[0]["content"])
        if expect not in text or "[exit code: 0]" not in text:
            self.bad += 1
        if record:
            self.times.append(took)

    async def loop(self, stop: asyncio.Event, offset: int) -> None:
        n = offset
        while not stop.is_set():
            await self.call(n)
            n += 1

    async def close(self) -> None:  # (also after an open() that failed part way)
        env, sandbox = getattr(self, "env", None), getattr(self, "sandbox", None)
        for tool in env.by_name.values() if env is not None else ():
            await tool.close()
        if sandbox is not None:
            await sandbox.close()


async def run_path(path: str, sessions: int, seconds: float, state_dir: str, hostile: int) -> dict:
    """``path``: old or new, or new+flood / new+fork: ``hostile`` of the sessions run
    that hostile command instead (their calls are not counted)."""
    from rollserve.sandbox import watch
    from rollserve.sandbox.base import SandboxSpec
    from rollserve.sandbox.bubblewrap import BubblewrapRuntime

    way, _, attack = path.partition("+")
    watch.SHARED_TICK = way == "new"
    runtime = BubblewrapRuntime(state_dir=state_dir)
    spec = SandboxSpec(files={"hello.txt": "hello\n"})
    bad = hostile if attack else 0
    group = [Session(runtime, spec, attack if i < bad else None) for i in range(sessions)]
    honest = [s for s in group if s.hostile is None]
    opened: list[Session] = []
    try:
        for start in range(0, sessions, 16):  # (opened in batches: 200 bwraps at once is a start storm)
            batch = group[start : start + 16]
            opened += batch  # before the starts: a batch where one start fails still has its others closed
            failed = [e for e in await asyncio.gather(*(s.open() for s in batch), return_exceptions=True) if e]
            if failed:
                raise failed[0]
        await asyncio.sleep(1.0)  # settle: the starts' leftovers
        for s in group:
            s.times.clear()
            s.bad = 0
        stop = asyncio.Event()
        boxes = [s.sandbox for s in honest]
        tree0 = tree_cpu(boxes)
        cpu0, machine0, wall0, load0 = own_cpu(), machine_cpu(), time.perf_counter(), load()
        loops = [asyncio.ensure_future(s.loop(stop, i)) for i, s in enumerate(group)]
        await asyncio.sleep(seconds)
        stop.set()
        cpu1, machine1, wall1 = own_cpu(), machine_cpu(), time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*loops), 120)
        tree1 = tree_cpu(boxes)  # (after the last calls end: their commands reaped)
    finally:
        await asyncio.gather(*(s.close() for s in opened), return_exceptions=True)
    times = [t for s in honest for t in s.times]
    calls = len(times)
    wall = wall1 - wall0
    return {
        "path": path,
        "sessions": sessions,
        "seconds": wall,
        "calls": calls,
        "hostile_sessions": bad,
        "bad_outputs": sum(s.bad for s in honest),
        "calls_per_s": calls / wall,
        "p50_ms": 1000 * median(times),
        "p99_ms": 1000 * percentile(times, 99),
        "server_cpu_ms_per_call": 1000 * (cpu1 - cpu0) / max(calls, 1),
        "server_cpu_share": (cpu1 - cpu0) / wall,
        "sandbox_cpu_ms_per_call": 1000 * (tree1 - tree0) / max(calls, 1),
        "machine_cpu_ms_per_call": 1000 * (machine1 - machine0) / max(calls, 1),
        "machine_cpu_share": (machine1 - machine0) / wall,
        "load_before": load0,
        "load_after": load(),
    }


def with_bound(result: dict) -> dict:
    """The calls/s this machine's cores could make at the server's and the sandboxes'
    CPU per call, were nothing else running (the machine is shared: its CPU per call
    counts every other process too)."""
    spent = result["server_cpu_ms_per_call"] + result["sandbox_cpu_ms_per_call"]
    return {**result, "cpu_bound_calls_per_s": (os.cpu_count() or 1) * 1000 / spent if spent else float("nan")}


async def fork_exec_cost(state_dir: str, rounds: int = 200) -> dict:
    """What one fork/exec of ``ls`` costs inside a sandbox's shell, measured alone:
    ``ls`` vs the builtin ``echo`` on one idle shell, in turn."""
    from rollserve.sandbox.base import SandboxSpec
    from rollserve.sandbox.bubblewrap import BubblewrapRuntime
    from rollserve.sandbox.tools.bash import BashSession

    runtime = BubblewrapRuntime(state_dir=state_dir)
    async with await runtime.start(SandboxSpec()) as sandbox, BashSession(sandbox) as shell:
        out: dict[str, float] = {}
        for command in ("echo hi", "ls", "echo hi", "ls"):  # (the first pair warms up)
            tree0, cpu0, started = tree_cpu([sandbox]), own_cpu(), time.perf_counter()
            for _ in range(rounds):
                await shell.run(command)
            out[f"{command}_ms"] = 1000 * (time.perf_counter() - started) / rounds
            out[f"{command}_sandbox_cpu_ms"] = 1000 * (tree_cpu([sandbox]) - tree0) / rounds
            out[f"{command}_server_cpu_ms"] = 1000 * (own_cpu() - cpu0) / rounds
    out["fork_exec_ms"] = out["ls_ms"] - out["echo hi_ms"]
    out["fork_exec_sandbox_cpu_ms"] = out["ls_sandbox_cpu_ms"] - out["echo hi_sandbox_cpu_ms"]
    return out


async def main(sessions: int, seconds: float, paths: list[str], hostile: int) -> None:
    state = state_dir()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # (the benchmark's, for its many PTYs)
    results = []
    for path in paths:
        print(f"{path}: {sessions} sessions for {seconds:g} s ...", file=sys.stderr, flush=True)
        results.append(with_bound(await run_path(path, sessions, seconds, state, hostile)))
    fork = await fork_exec_cost(state)
    rows = [
        [
            r["path"],
            r["sessions"],
            r["hostile_sessions"],
            r["calls"],
            r["calls_per_s"],
            r["p50_ms"],
            r["p99_ms"],
            r["server_cpu_ms_per_call"],
            r["sandbox_cpu_ms_per_call"],
            r["machine_cpu_ms_per_call"],
            r["cpu_bound_calls_per_s"],
            r["bad_outputs"],
        ]
        for r in results
    ]
    clean = [r for r in results if not r["hostile_sessions"]]
    best = max(r["calls_per_s"] for r in clean)
    bound = max(r["cpu_bound_calls_per_s"] for r in clean)
    targets = {
        "calls_per_s": {"target": ">= 1000", "measured": best, "met": best >= 1000},
        "cpu_bound_calls_per_s": {"target": ">= 1000", "measured": bound, "met": bound >= 1000},
    }
    report(
        "tool_calls",
        f"Tool-call capacity: {sessions} sessions, each a bubblewrap sandbox and a bash tool, for {seconds:g} s",
        [
            "path",
            "sessions",
            "hostile",
            "calls",
            "calls/s",
            "p50 ms",
            "p99 ms",
            "server CPU ms/call",
            "sandbox CPU ms/call",
            "machine CPU ms/call",
            "CPU-bound calls/s",
            "bad outputs",
        ],
        rows,
        {
            "config": {
                "sessions": sessions,
                "seconds": seconds,
                "commands": [c for c, _ in COMMANDS],
                "hostile_commands": HOSTILE,
                "load_at_end": load(),
            },
            "results": results,
            "fork_exec_alone": fork,
            "targets": targets,
        },
    )
    print(f"fork/exec alone: {fork}")
    for name, target in targets.items():
        met = "MET" if target["met"] else "NOT MET"
        print(f"target {name} {target['target']}: measured {target['measured']:.0f}, {met}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--paths", default="old,new,new+flood,new+fork")
    parser.add_argument("--hostile", type=int, default=10, help="hostile sessions in the +flood, +fork paths")
    args = parser.parse_args()
    asyncio.run(main(args.sessions, args.seconds, args.paths.split(","), args.hostile))
