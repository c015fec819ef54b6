"""The start-up reaper: a restarted server cleans up exactly the sandboxes its dead
predecessor left behind (owner records: owner.py).

``reap(state_dir)`` runs at server start: each record whose owner is dead (pid gone,
or alive with another start time: a reused pid) goes to the runtime named in it,
whose ``reap(record)`` kills the recorded processes and their descendants, removes
what else it made (a container, a cgroup) and the folders; then the record is
deleted. Records of live owners are left alone (another server may share the state
dir). A record naming a runtime this server does not know still has its processes
killed and its folders removed (``FolderRuntime.reap``), and the report says so.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from rollserve.sandbox.common import FolderRuntime
from rollserve.sandbox.owner import OwnerRecord, Reaped, is_alive
from rollserve.sandbox.registry import RUNTIMES

log = logging.getLogger(__name__)


@dataclass
class ReapReport:
    reaped: list[str] = field(default_factory=list)  # sandbox ids cleaned up
    killed: list[int] = field(default_factory=list)  # host pids killed
    kept: list[str] = field(default_factory=list)  # sandboxes of live owners
    errors: list[str] = field(default_factory=list)


def reap_record(record: OwnerRecord) -> Reaped:
    """Clean up one dead owner's sandbox, by the runtime named in its record."""
    runtime = RUNTIMES.get(record.runtime)
    if runtime is not None:
        return runtime.reap(record)
    reaped = FolderRuntime.reap(record)
    reaped.errors.append(
        f"{record.sandbox_id}: unknown runtime {record.runtime!r}: its "
        "processes and folders are gone, anything else it made is left"
    )
    return reaped


def reap(state_dir: Path | str) -> ReapReport:
    """Clean up every sandbox whose owner is dead; leave live owners' sandboxes alone."""
    report = ReapReport()
    folder = Path(state_dir) / "sandboxes"
    if not folder.is_dir():
        return report
    for path in sorted(folder.glob("*.json")):
        try:
            record = OwnerRecord.model_validate_json(path.read_text())
        except (OSError, ValueError) as error:
            report.errors.append(f"{path.name}: unreadable record ({error}); left in place")
            continue
        if is_alive(record.owner):
            report.kept.append(record.sandbox_id)
            continue
        reaped = reap_record(record)
        report.killed += reaped.killed
        report.errors += reaped.errors
        path.unlink(missing_ok=True)
        report.reaped.append(record.sandbox_id)
    for tmp in folder.glob("*.tmp"):  # a write-then-rename cut short by the crash
        try:
            if not psutil.pid_exists(int(tmp.suffixes[-2][1:])):
                tmp.unlink(missing_ok=True)
        except (ValueError, IndexError):
            pass
    if report.reaped:
        log.warning("reaped %d sandboxes of dead owners (%d processes killed)", len(report.reaped), len(report.killed))
    return report
