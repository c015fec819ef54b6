"""The one walk of a sandbox's process trees that its caps share (rsscap.py's resident
memory, cpucap.py's CPU budget, and ``FolderSandbox.host_pids`` for the disk and memfd
caps): given the runtime's host processes, they and all their descendants now.

Two ways, the same answer:

- each thread's ``/proc/PID/task/TID/children`` (the kernel's list of the children that
  thread started): only the tree is read, not the host's whole /proc. The kernel builds
  a ``children`` file one entry at a time, so a child that exits while it is read can
  hide a sibling from that one reading (the next one sees it).
- where those files do not exist (a kernel built without ``CONFIG_PROC_CHILDREN``: the
  files are simply absent, and a walk through them would see the roots alone, so the
  caps would count next to nothing): one pass over every ``/proc/PID/stat`` of the host,
  each process's parent from it, then the tree from the roots down.

Which one is decided once, at the first walk (``children_files``), and logged when it is
the full pass.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Iterable

log = logging.getLogger(__name__)


@functools.cache
def children_files() -> bool:
    """Whether this kernel has ``/proc/PID/task/TID/children`` (``CONFIG_PROC_CHILDREN``)."""
    here = os.path.exists(f"/proc/{os.getpid()}/task/{threading.get_native_id()}/children")
    if not here:
        log.warning(
            "this kernel has no /proc/PID/task/TID/children (CONFIG_PROC_CHILDREN): "
            "the sandbox caps find a sandbox's processes by a pass over all of /proc"
        )
    return here


def tree_pids(roots: Iterable[int], by_children: bool | None = None) -> list[int]:
    """``roots`` and all their descendants now (host pids), sorted; a root that is gone
    is still listed (with no children). ``by_children``: walk the ``children`` files
    (True) or the parents of every process in /proc (False); None: the files where the
    kernel has them."""
    if by_children is None:
        by_children = children_files()
    return _by_children(roots) if by_children else _by_parents(roots)


def _by_children(roots: Iterable[int]) -> list[int]:
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:  # gone
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/children", "rb") as children:
                    stack += (int(child) for child in children.read().split())
            except (OSError, ValueError):
                continue
    return sorted(seen)


def _by_parents(roots: Iterable[int]) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (parent := parent_pid(int(name))) is not None:
            children.setdefault(parent, []).append(int(name))
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        pid = stack.pop()
        if pid not in seen:
            seen.add(pid)
            stack += children.get(pid, ())
    return sorted(seen)


def stat_fields(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/PID/stat`` after the name, so the state (field 3) is at 0;
    None once ``pid`` is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read()
    except OSError:
        return None
    # The name (field 2) may hold spaces and parentheses: fields follow the last ')'.
    return text[text.rfind(b")") + 2 :].split()


def parent_pid(pid: int) -> int | None:
    """The parent of ``pid`` (field 4 of ``/proc/PID/stat``; a thread's children have
    its process as parent); None once it is gone."""
    fields = stat_fields(pid)
    try:
        return int(fields[1]) if fields is not None else None
    except (IndexError, ValueError):
        return None
