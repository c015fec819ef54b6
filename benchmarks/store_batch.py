"""Writing a submitted batch to the store: a statement a row (the old path) against
one statement per table (``engine.store.batch``), alone and beside a busy thread.

SQLite's Python module lets go of the GIL around every step of a statement; a
statement a row then waits, for each row, for the other thread to hand the GIL back.
Here the other thread stands in for the server's event loop: a pure-Python loop that
never blocks. Each write is ``--groups`` groups of ``--n`` rollouts (math specs) into a
store in use (one file per path, written once before the timed writes), on a thread of
its own as the store does it, each timed with its commit; the two paths alternate
``--rounds`` times. Reports each path's median and worst wall time, alone and busy.

    python -m benchmarks.store_batch [--groups 1000] [--n 1] [--rounds 5]
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.common import median, report
from rollserve.engine.rollout import RolloutSpec
from rollserve.engine.store import GroupRow
from rollserve.engine.store.batch import insert_groups
from rollserve.engine.store.schema import connect

Batch = list[tuple[GroupRow, list[RolloutSpec]]]


def _batch(groups: int, n: int, tag: str) -> Batch:
    out = []
    for g in range(groups):
        gid = f"g-{tag}-{g}"
        specs = [RolloutSpec(id=f"{gid}-{i}", group_id=gid, task_id=gid, data_source="math", sample_index=i,
                             instance={"question": f"What is {g} + {g}?", "answer": str(2 * g)})
                 for i in range(n)]
        out.append((GroupRow(gid, gid, None, "", n, time.time()), specs))
    return out


def row_by_row(conn: sqlite3.Connection, groups: Batch, now: float) -> None:
    """The old path: a statement per group, ``executemany`` over its rollouts."""
    for group, specs in groups:
        conn.execute("INSERT INTO groups VALUES (?,?,?,?,?,?)",
                     (group.id, group.task_id, group.client_key, group.request_hash, group.n, group.created_at))
        conn.executemany("INSERT INTO rollouts (id, group_id, spec, status, attempt, created_at, updated_at)"
                         " VALUES (?,?,?,?,?,?,?)",
                         [(s.id, group.id, s.model_dump_json(), "queued", 1, now, now) for s in specs])


def _timed_write(conn: sqlite3.Connection, write, groups: Batch, busy: bool) -> float:
    took: list[float] = []

    def writer() -> None:
        t0 = time.perf_counter()
        with conn:
            write(conn, groups, time.time())
        took.append(time.perf_counter() - t0)

    thread = threading.Thread(target=writer)
    thread.start()
    while busy and thread.is_alive():
        sum(range(1000))  # the "event loop": Python bytecode, never blocking
    thread.join()
    return took[0]


def main(groups: int, n: int, rounds: int) -> None:
    paths = {"a statement a row (old)": row_by_row, "one statement per table (new)": insert_groups}
    times: dict[str, dict[str, list[float]]] = {p: {"alone": [], "busy": []} for p in paths}
    with tempfile.TemporaryDirectory() as tmp:
        conns = {label: connect(str(Path(tmp) / f"{i}.db")) for i, label in enumerate(paths)}
        for label, conn in conns.items():  # (a store in use: its file and WAL made, its pages cached)
            _timed_write(conn, paths[label], _batch(groups, n, f"warm{label[:3]}"), False)
        k = 0
        for r in range(rounds):
            order = list(paths) if r % 2 == 0 else list(reversed(paths))
            for label in order:
                for mode in ("alone", "busy"):
                    k += 1
                    batch = _batch(groups, n, str(k))
                    times[label][mode].append(_timed_write(conns[label], paths[label], batch, mode == "busy"))
        for conn in conns.values():
            conn.close()
    rows = [[label, round(1000 * median(t["alone"]), 1), round(1000 * max(t["alone"]), 1),
             round(1000 * median(t["busy"]), 1), round(1000 * max(t["busy"]), 1)] for label, t in times.items()]
    report("store_batch", f"{groups} groups x {n} rollouts written to the store, {rounds} rounds",
           ["path", "alone median (ms)", "alone max (ms)", "beside a busy thread median (ms)",
            "beside a busy thread max (ms)"], rows,
           {"config": {"groups": groups, "n": n, "rounds": rounds, "sqlite": sqlite3.sqlite_version},
            "results": {label: {mode: [1000 * x for x in v] for mode, v in t.items()} for label, t in times.items()}})


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--n", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    main(args.groups, args.n, args.rounds)
