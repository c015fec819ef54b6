"""The soak's server under a memory probe: ``rollserve serve`` run in this process,
tracemalloc on from half the first probe's time (once it is up). At each of ``--at``
seconds after start a probe is written to ``OUT/probe-SECONDS.json``: RSS,
``/proc/self/smaps_rollup`` (anonymous vs file-backed), the heap as glibc reports it
(``mallinfo2``), ``gc.get_objects()`` counts by type; and a tracemalloc snapshot to
``OUT/snap-SECONDS.pickle``, to diff by traceback. The last probe also measures RSS
after ``malloc_trim(0)`` (a measurement of what the allocator holds free, not a fix).
With ``ROLLSERVE_SOAK_REFERRERS=TypeName`` each probe also follows a chain of
referrers up from the oldest objects of that type (what keeps them alive).

    python -m benchmarks.soak_trace OUT --at 300,900 -- serve --port ...

``benchmarks/soak.py --trace OUT`` starts the server this way;
``python -m benchmarks.soak_trace --diff OUT/snap-300.pickle OUT/snap-900.pickle``
prints the tracebacks that grew most between two snapshots.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import sys
import threading
import time
import tracemalloc
from collections import Counter
from pathlib import Path


def smaps_rollup() -> dict[str, int]:
    out = {}
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3 and parts[2] == "kB":
                out[parts[0].rstrip(":")] = int(parts[1])
    return out


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def heap() -> dict[str, int]:
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _Mallinfo2
    info = libc.mallinfo2()
    return {name: getattr(info, name) for name, _ in _Mallinfo2._fields_}


def rss_kb() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def _describe(obj: object, child: object) -> str:
    name = type(obj).__qualname__
    if isinstance(obj, dict):
        keys = [k for k, v in obj.items() if v is child]
        return f"dict[{keys[0]!r}]" if keys else f"dict (key: {next((k for k in obj if k is child), '?')!r})"
    return name


def referrer_chains(type_name: str, count: int = 3, depth: int = 12) -> list[list[str]]:
    """For ``count`` of the oldest live objects of ``type_name``: a chain of referrers
    up to ``depth`` long (at each step a referrer that is not a frame nor this probe's
    own list, one that is not a list first)."""
    found = [o for o in gc.get_objects() if type(o).__qualname__ == type_name][:count]
    chains = []
    for obj in found:
        chain: list[str] = []
        mine = {id(found), id(chain)}
        child = obj
        for _ in range(depth):
            parents = gc.get_referrers(child)
            mine.add(id(parents))
            usable = [r for r in parents if id(r) not in mine and type(r).__name__ != "frame"]
            if not usable:
                chain.append("(no tracked referrer: a root, or a frozen object)")
                break
            usable.sort(key=lambda r: isinstance(r, list))
            parent = usable[0]
            chain.append(
                f"{_describe(parent, child)} (of {len(usable)} referrers: "
                f"{sorted({type(r).__qualname__ for r in usable})[:6]})"
            )
            mine.add(id(parent))
            child = parent
            del parents, usable
        chains.append(chain)
    return chains


def probe(out: Path, at: float, trim: bool) -> None:
    gc.collect()
    types = Counter(type(o).__qualname__ for o in gc.get_objects())
    snap = tracemalloc.take_snapshot()
    snap.dump(str(out / f"snap-{at:g}.pickle"))
    record = {
        "t": at,
        "rss_kb": rss_kb(),
        "smaps": smaps_rollup(),
        "heap": heap(),
        "traced_kb": tracemalloc.get_traced_memory()[0] // 1024,
        "gc_types": dict(types.most_common(200)),
        "objects": sum(types.values()),
    }
    if os.environ.get("ROLLSERVE_SOAK_REFERRERS"):
        record["referrers"] = referrer_chains(os.environ["ROLLSERVE_SOAK_REFERRERS"])
    if trim:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        record["rss_kb_after_malloc_trim"] = rss_kb()
        record["heap_after_malloc_trim"] = heap()
    (out / f"probe-{at:g}.json").write_text(json.dumps(record, indent=1))


def _timer(out: Path, times: list[float]) -> None:
    t0 = time.monotonic()
    # Tracing starts once the server is up (start-up under tracemalloc is too slow on a
    # loaded machine): what grows between two probes is allocated after it.
    time.sleep(max(0.0, t0 + min(times) / 2 - time.monotonic()))
    tracemalloc.start(int(os.environ.get("ROLLSERVE_SOAK_FRAMES", "12")))
    for i, at in enumerate(times):
        time.sleep(max(0.0, t0 + at - time.monotonic()))
        probe(out, at, trim=i == len(times) - 1)


def diff(a: str, b: str, top: int = 25) -> None:
    old, new = tracemalloc.Snapshot.load(a), tracemalloc.Snapshot.load(b)
    for key in ("traceback", "filename"):
        print(f"--- by {key}")
        for stat in new.compare_to(old, key)[:top]:
            print(f"{stat.size_diff / 1024:+10.1f} KiB {stat.count_diff:+8d} blocks")
            for line in stat.traceback.format(limit=8 if key == "traceback" else 1):
                print("   ", line)


def main() -> None:
    if sys.argv[1] == "--diff":
        diff(sys.argv[2], sys.argv[3])
        return
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    times = [float(x) for x in sys.argv[3].split(",")]
    threading.Thread(target=_timer, args=(out, times), daemon=True).start()
    sys.argv = ["rollserve", *sys.argv[5:]]
    from rollserve.cli import main as cli

    cli()


if __name__ == "__main__":
    main()
