"""Where the server's CPU goes in ``benchmarks.concurrency``'s math rollouts, by section
and by function: ``benchmarks.concurrency_profile``'s sampled run (py-spy ``--gil`` on the
server from the trainer's first submit to its last result, each sample charged to the
first section a frame names from the leaf up, ``concurrency_profile.SECTIONS``), plus
the rollserve functions holding the most samples (inclusive) so the per-component
figures point at code. Each section's and function's ms per
rollout is its share of the samples times the run's measured CPU per rollout. py-spy is
not a dependency of rollserve: pass its binary.

    python -m benchmarks.run_path_profile --py-spy /path/to/py-spy [--before OLD/src]
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from benchmarks import concurrency, concurrency_profile
from benchmarks.concurrency_profile import SECTIONS, sampled_run, section

TOP_FUNCTIONS = 25


def _functions(stack: str) -> set[str]:
    """The rollserve functions a stack passes through (``Class.method (module)``)."""
    names = set()
    for frame in stack.split(";"):
        found = re.match(r"(.+?) \((?:.*/)?(rollserve/[^:]+):\d+\)", frame)
        if found:
            names.add(f"{found.group(1)} ({found.group(2)})")
    return names


def profile(src: Path, spy: str, setup: concurrency.Setup) -> dict:
    """One ``concurrency.run_once`` of the tree at ``src``, its server sampled meanwhile."""
    data, lines = sampled_run(src, spy, setup)
    sections: Counter[str] = Counter()
    functions: Counter[str] = Counter()
    for line in lines:
        stack, _, n = line.rpartition(" ")
        if stack:
            sections[section(stack)] += int(n)
            for name in _functions(stack):
                functions[name] += int(n)
    total = sum(sections.values()) or 1
    cpu = data["server_process_cpu_ms_per_rollout"]
    return {
        "server_process_cpu_ms_per_rollout": cpu,
        "cpu_ms_per_rollout_with_scoring_workers": data["cpu_ms_per_rollout"],
        "load_avg_1m_before": data["load_avg_1m_before"],
        "all_completed_once": data["all_completed_once"],
        "samples": total,
        "sections": {name: {"share": sections[name] / total, "ms_per_rollout": cpu * sections[name] / total}
                     for name in [*(s for s, _ in SECTIONS), "other"]},
        "functions_inclusive": {name: {"share": n / total, "ms_per_rollout": cpu * n / total}
                                for name, n in functions.most_common(TOP_FUNCTIONS)},
    }


if __name__ == "__main__":
    concurrency_profile.cli(__doc__, name="run_path_profile", run=profile)
