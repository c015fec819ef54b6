"""The soak benchmark's sampler (the server's process tree, its sandboxes, its state
folder), the growth of each measure, what is left after shutdown, and the plot."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import time
from pathlib import Path

import httpx
import psutil

MEASURES = {
    "rss_mb": "server RSS (MB)",
    "tree_rss_mb": "server + children RSS (MB)",
    "fds": "server open fds",
    "threads": "server threads",
    "children": "child processes",
    "bwrap": "bubblewrap processes",
    "owner_records": "sandbox owner records",
    "open_sandboxes": "open sandboxes (status)",
    "state_mb": "state folder (MB)",
}
# Measures that follow the load from moment to moment (a count of what is in flight)
# rather than accumulating: their growth is still reported, their trend is what tells.
LOAD_FOLLOWING = ("children", "bwrap", "owner_records", "open_sandboxes", "in_flight")


def folder_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


class Sampler:
    """Samples the server's tree every few seconds; remembers every process and every
    sandbox folder it saw, to prove after shutdown that none is left."""

    def __init__(self, server: psutil.Process, state: Path):
        self.server, self.state = server, state
        self.api: httpx.AsyncClient | None = None
        self.samples: list[dict] = []
        self.seen: dict[int, float] = {}  # pid -> create time
        self.folders: set[str] = set()

    def _tree(self) -> dict:
        children = self.server.children(recursive=True)
        rss = self.server.memory_info().rss
        tree_rss, bwrap = rss, 0
        for p in children:
            with contextlib.suppress(psutil.Error):
                self.seen.setdefault(p.pid, p.create_time())
                tree_rss += p.memory_info().rss
                bwrap += p.name() == "bwrap"
        records = list((self.state / "sandboxes").glob("*.json"))
        for path in records:
            with contextlib.suppress(OSError, ValueError):
                self.folders.update(json.loads(path.read_text()).get("folders", []))
        return {"rss_mb": rss / 2**20, "tree_rss_mb": tree_rss / 2**20, "fds": self.server.num_fds(),
                "threads": self.server.num_threads(), "children": len(children), "bwrap": bwrap,
                "owner_records": len(records), "state_mb": folder_bytes(self.state) / 2**20}

    async def once(self, t: float) -> None:
        sample = {"t": round(t, 1), **await asyncio.to_thread(self._tree)}
        if self.api is not None:
            with contextlib.suppress(httpx.HTTPError):
                status = (await self.api.get("/v1/status", timeout=30)).json()
                sample["open_sandboxes"] = status["sandboxes"]["open"]
                sample["in_flight"] = status["in_flight"]
        self.samples.append(sample)

    async def run(self, t0: float, every: float) -> None:
        while True:
            await self.once(time.monotonic() - t0)
            await asyncio.sleep(every)


def growth(samples: list[dict], warmup_min: float, window_min: float) -> dict:
    """Per measure: the mean over ``window`` minutes from ``warmup`` on, the mean over the
    last ``window`` minutes (the final after-drain sample left out), the change, and the
    trend per hour (the slope of a least-squares line through the samples from ``warmup``
    on: a leak shows as a steady slope however short the run)."""
    run = samples[:-1]
    end_t = run[-1]["t"]
    start = [s for s in run if 60 * warmup_min <= s["t"] < 60 * (warmup_min + window_min)]
    last = [s for s in run if s["t"] >= end_t - 60 * window_min]
    out = {}
    for name in [*MEASURES, "in_flight"]:
        a = [s[name] for s in start if name in s]
        b = [s[name] for s in last if name in s]
        if not a or not b:
            continue
        mean_a, mean_b = statistics.fmean(a), statistics.fmean(b)
        after = [s for s in run if s["t"] >= 60 * warmup_min and name in s]
        slope = statistics.linear_regression([s["t"] for s in after], [s[name] for s in after]).slope
        out[name] = {"start": round(mean_a, 2), "end": round(mean_b, 2),
                     "growth": round((mean_b - mean_a) / mean_a, 4) if mean_a else 0.0,
                     "trend_per_hour": round(3600 * slope, 2),  # a least-squares line from the warm-up on
                     "max": round(max(s[name] for s in run if name in s), 2),
                     "follows_load": name in LOAD_FOLLOWING}
    return out


def _alive(seen: dict[int, float]) -> dict[int, str]:
    alive = {}
    for pid, created in seen.items():
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(pid)
            if p.create_time() == created:
                alive[pid] = " ".join(p.cmdline())[:120]
    return alive


def leftovers(sampler: Sampler, state: Path, grace: float = 10.0) -> dict:
    """After the server's exit: its processes still alive at once and after ``grace``
    seconds (multiprocessing's forkserver and resource tracker end on their own when
    they see the server's end of their pipes close), owner records and sandbox folders
    left."""
    at_exit = _alive(sampler.seen)
    deadline = time.monotonic() + grace
    later = at_exit
    while later and time.monotonic() < deadline:
        time.sleep(0.1)
        later = _alive(sampler.seen)
    return {"processes_seen": len(sampler.seen), "processes_alive_at_exit": at_exit,
            f"processes_alive_{grace:g}s_after_exit": later,
            "owner_records": len(list((state / "sandboxes").glob("*.json"))),
            "sandbox_folders_seen": len(sampler.folders),
            "sandbox_folders_left": sorted(f for f in sampler.folders if os.path.exists(f))}


def plot(samples: list[dict], restarts: list[dict], warmup_min: float, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in MEASURES if any(n in s for s in samples)]
    fig, axes = plt.subplots(3, 3, figsize=(13, 9), sharex=True)
    for ax, name in zip(axes.flat, names, strict=False):
        points = [(s["t"] / 60, s[name]) for s in samples if name in s]
        ax.plot([p[0] for p in points], [p[1] for p in points], lw=1.2)
        ax.axvspan(0, warmup_min, color="0.9", label="warm-up")
        for r in restarts:
            ax.axvline(r["t"] / 60, color="tab:red", ls="--", lw=0.8)
        ax.set_title(MEASURES[name], fontsize=10)
        ax.set_ylim(bottom=0)
    for ax in axes[-1]:
        ax.set_xlabel("minutes")
    fig.suptitle(f"{title}\n(grey: warm-up, not measured for growth; red: backend killed and restarted)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
