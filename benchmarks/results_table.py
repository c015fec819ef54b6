"""The dashboard's results table over a large store: one page of summaries with its
(capped) count, against counting every match in full (what the table did before the
count was capped).

A store file is filled with N finished results (synthetic rows: a mix of data
sources, statuses and failures, a ~2 KB stored result each), then opened by
rollserve's own SQLiteStore (its indexes) and queried through ``store.summaries`` per
filter; the full count is one ``SELECT COUNT(*)`` over the same condition.

    python -m benchmarks.results_table [--rows 50000] [--repeat 20]

It writes ``results/results_table.json`` (50,000 rows) or ``results_table_<N>k.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sqlite3
import tempfile
import time
from pathlib import Path

from benchmarks.common import median, report
from rollserve.engine.store import SQLiteStore, SummaryFilter

SOURCES = [("math", 0.6), ("code", 0.25), ("stem", 0.149), ("swe", 0.001)]
OUTCOMES = [("completed", None, 0.8), ("failed", "infra", 0.08), ("timed_out", "timeout", 0.07),
            ("failed", "agent", 0.05)]
FILTERS = {
    "none": SummaryFilter(),
    "failure_kind=timeout": SummaryFilter(failure_kind="timeout"),
    "data_source=math, masked": SummaryFilter(data_source="math", masked=True),
    "swe, timed_out (rare)": SummaryFilter(data_source="swe", status="timed_out"),
}


def _pick(rng: random.Random, weighted: list[tuple]) -> tuple:
    return rng.choices(weighted, weights=[w[-1] for w in weighted])[0]


def fill(path: Path, rows: int) -> None:
    asyncio.run(_create(path))
    rng = random.Random(0)
    blob = json.dumps({"trajectory": {"tokens": {"input_ids": list(range(400))}}})
    now = time.time()
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("INSERT INTO groups (id, task_id, request_hash, n, created_at) "
                     "VALUES ('g', 't', 'h', 1, ?)", (now,))
        batch = []
        for seq in range(1, rows + 1):
            source = _pick(rng, SOURCES)[0]
            status, kind, _ = _pick(rng, OUTCOMES)
            masked = int(kind in ("infra", "timeout"))
            batch.append((f"r{seq}", "g", "{}", status, blob, seq, now, now, now, 1,
                          None if masked else float(rng.random() < 0.4), masked, source, kind,
                          rng.uniform(1, 300), rng.randrange(10)))
        conn.executemany(
            "INSERT INTO rollouts (id, group_id, spec, status, result, seq, created_at, "
            "updated_at, finished_at, usable, reward, masked, data_source, failure_kind, "
            "duration, policy_version) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", batch)
    conn.close()


async def _create(path: Path) -> None:
    store = SQLiteStore(path)
    await store.open()
    await store.close()


async def measure(path: Path, repeat: int) -> dict[str, dict]:
    store = SQLiteStore(path)
    await store.open()
    conn = sqlite3.connect(path)
    out: dict[str, dict] = {}
    try:
        for name, where in FILTERS.items():
            condition, args = where.where()
            page, full = [], []
            for _ in range(repeat):
                began = time.perf_counter()
                rows, total = await store.summaries(where, None, 25)
                page.append(time.perf_counter() - began)
                began = time.perf_counter()
                (count,) = conn.execute(f"SELECT COUNT(*) FROM rollouts WHERE {condition}",
                                        args).fetchone()
                full.append(time.perf_counter() - began)
            out[name] = {"matches": count, "page_rows": len(rows), "count_shown": total,
                         "page_and_capped_count_ms": 1000 * median(page),
                         "full_count_ms": 1000 * median(full)}
    finally:
        conn.close()
        await store.close()
    return out


def main(rows: int, repeat: int) -> None:
    with tempfile.TemporaryDirectory(prefix="rollserve-bench-") as folder:
        path = Path(folder) / "rollserve.db"
        began = time.perf_counter()
        fill(path, rows)
        filled_s = time.perf_counter() - began
        size_mb = path.stat().st_size / 1e6
        data = asyncio.run(measure(path, repeat))
    table = [[name, r["matches"], r["count_shown"], f"{r['page_and_capped_count_ms']:.1f}",
              f"{r['full_count_ms']:.1f}",
              f"{r['full_count_ms'] / max(r['page_and_capped_count_ms'], 1e-3):.1f}x"]
             for name, r in data.items()]
    # 50,000 rows (the default) -> results_table.json; another size gets its own file.
    name = "results_table" if rows == 50_000 else f"results_table_{rows // 1000}k"
    report(name, f"results table over {rows:,} finished results ({size_mb:.0f} MB store), "
           f"median of {repeat}", ["filter", "matches", "count shown", "page + capped count ms",
                                   "full count ms", "full / page"], table,
           {"config": {"rows": rows, "repeat": repeat, "store_mb": size_mb, "fill_s": filled_s},
            "results": data})


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=20)
    ns = parser.parse_args()
    main(ns.rows, ns.repeat)
