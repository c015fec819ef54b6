"""The soak's RSS slope before and after a fix, side by side: two runs of
``benchmarks/soak.py`` (the same options; one on the old code, one on the new), and
optionally the memory probes of a diagnosis run (``benchmarks/soak_trace.py``).

    python -m benchmarks.soak_slope BEFORE.json AFTER.json [--probes DIR] [--after-probes DIR]
        [--referrers PROBE.json]

Writes ``results/soak_slope.json``: per run, the server RSS's trend per hour (a
least-squares line through the samples from the warm-up on), its growth between the
two windows, the rollouts it ran and its accounting; the probes' counts of live
gateway sessions, their sockets and trajectories, the RSS, the glibc heap and the RSS
after ``malloc_trim``; and the size of aiohttp's middleware cache (what held the
sessions)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from aiohttp import web_app

from benchmarks.common import report

KEPT = ("GatewaySession", "SessionSocket", "Trajectory", "UrlDispatcher")


def run_summary(path: Path) -> dict:
    data = json.loads(path.read_text())
    grow = data["growth"]
    counts = data["accounting"]
    return {
        "file": path.name,
        "config": data["config"],
        "load_avg_1m_start_end": data["load_avg_1m_start_end"],
        "rss_mb_trend_per_hour": grow["rss_mb"]["trend_per_hour"],
        "rss_mb_start": grow["rss_mb"]["start"],
        "rss_mb_end": grow["rss_mb"]["end"],
        "rss_growth": grow["rss_mb"]["growth"],
        "tree_rss_mb_trend_per_hour": grow["tree_rss_mb"]["trend_per_hour"],
        "submitted": counts["submitted"],
        "gateway_rollouts": sum(counts["by_kind"].get("gateway", {}).values()),
        "lost": counts["lost"],
        "streamed_twice": counts["streamed_twice"],
        "leftovers_after_shutdown": data["leftovers_after_shutdown"],
        "growth": grow,
        "samples": [{"t": s["t"], "rss_mb": round(s["rss_mb"], 2)} for s in data["samples"]],
    }


def probe_summary(folder: Path) -> list[dict]:
    out = []
    for path in sorted(folder.glob("probe-*.json"), key=lambda p: float(p.stem.split("-")[1])):
        p = json.loads(path.read_text())
        row = {
            "t_s": p["t"],
            "rss_mb": round(p["rss_kb"] / 1024, 1),
            "anonymous_mb": round(p["smaps"]["Anonymous"] / 1024, 1),
            "heap_mb": round(p["heap"]["arena"] / 2**20, 1),
            "heap_in_use_mb": round(p["heap"]["uordblks"] / 2**20, 1),
            "heap_free_mb": round(p["heap"]["fordblks"] / 2**20, 1),
            "traced_python_mb": round(p["traced_kb"] / 1024, 1),
            "tracked_objects": p["objects"],
            "live": {k: p["gc_types"].get(k, 0) for k in KEPT},
        }
        if "rss_kb_after_malloc_trim" in p:
            row["rss_mb_after_malloc_trim"] = round(p["rss_kb_after_malloc_trim"] / 1024, 1)
        out.append(row)
    return out


def main(args: argparse.Namespace) -> None:
    runs = {"before": run_summary(Path(args.before)), "after": run_summary(Path(args.after))}
    rows = [
        [
            name,
            r["config"]["minutes"],
            r["submitted"],
            r["gateway_rollouts"],
            r["rss_mb_start"],
            r["rss_mb_end"],
            f"{100 * r['rss_growth']:+.1f}%",
            r["rss_mb_trend_per_hour"],
            r["lost"],
        ]
        for name, r in runs.items()
    ]
    extra: dict = {
        "runs": runs,
        "aiohttp_middleware_cache_maxsize": web_app._cached_build_middleware.cache_info().maxsize,
    }
    if args.probes:
        extra["diagnosis_probes"] = probe_summary(Path(args.probes))
    if args.after_probes:
        extra["diagnosis_probes_after"] = probe_summary(Path(args.after_probes))
    if args.referrers:  # a probe taken with ROLLSERVE_SOAK_REFERRERS set: what held the objects
        probe = json.loads(Path(args.referrers).read_text())
        extra["referrer_chains"] = probe.get("referrers", [])
    report(
        "soak_slope",
        "soak: the server's RSS slope after the warm-up, before and after the gateway sessions were freed",
        [
            "code",
            "minutes",
            "rollouts",
            "gateway rollouts",
            "RSS MB, first window",
            "RSS MB, last window",
            "growth",
            "RSS MB per hour",
            "lost",
        ],
        rows,
        extra,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("before", help="the soak's JSON on the old code")
    parser.add_argument("after", help="the soak's JSON on the new code")
    parser.add_argument("--probes", default="", help="a diagnosis run's probe folder (soak.py --trace)")
    parser.add_argument("--after-probes", default="", help="the same probes on the new code")
    parser.add_argument("--referrers", default="", help="a probe's JSON with referrer chains (soak_trace.py)")
    main(parser.parse_args())
