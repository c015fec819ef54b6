"""Is a command waiting for input from its terminal? Asked of the kernel, or read
off the output where the kernel cannot be asked.

The bash tool asks this when a command has been silent for a moment, so that a
program waiting at a prompt (``read -p``, ``input()``, ``[Y/n]``) comes back to the
agent at once, to be answered with ``is_input``, while a program that is merely
silent (computing, sleeping, waiting on the network) runs on to its timeouts.

Where the sandbox's processes show in the host's ``/proc`` (local, bubblewrap,
apptainer) the answer is exact: a process of the terminal's foreground group is
blocked in ``read``/``readv`` on that terminal (``/proc/<pid>/syscall``). Where it
cannot tell (a terminal bridged by a container engine, ``/proc`` not readable, a
program blocked in ``poll``/``select``, which may be on the terminal or not), it says
so, and the caller looks at the output instead: a last line without a newline (a
prompt) that nothing has followed.
"""

from __future__ import annotations

import os
import platform

# System call numbers, per architecture: reads of one fd, and waits on many.
_READS = {"x86_64": {0, 19}, "aarch64": {63, 65}}  # read, readv
_WAITS = {  # poll, select, pselect6, ppoll, epoll_wait, epoll_pwait, epoll_pwait2
    "x86_64": {7, 23, 270, 271, 232, 281, 441},
    "aarch64": {72, 73, 22, 441},
}
_TTY = (5, 0)  # /dev/tty: the process's controlling terminal, whichever it is


def _read(path: str) -> str | None:
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:  # gone, or not ours to read
        return None


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat from the state on (field 3), so fields[i] is field i + 3."""
    text = _read(f"/proc/{pid}/stat")
    if not text:
        return None
    return text[text.rfind(")") + 2 :].split()  # the name may hold spaces and ")"


# Bounds on one check's walk of the process tree (an agent may fork thousands).
MAX_PROCESSES = 512
MAX_THREADS = 64


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks[:MAX_THREADS]:  # needs CONFIG_PROC_CHILDREN (as CRIU): on in common kernels
        text = _read(f"/proc/{pid}/task/{tid}/children")
        found += [int(child) for child in (text or "").split()]
    return found


def _descendants(pid: int, limit: int = MAX_PROCESSES) -> list[int]:
    """Breadth first, so a shallower process comes before a deeper one."""
    found: list[int] = []
    queue = [pid]
    while queue and len(found) < limit:
        children = _children(queue.pop(0))
        found += children
        queue += children
    return found[:limit]


def _innermost_pid(pid: int) -> int | None:
    """The pid as the process's own PID namespace numbers it (its ``$$``)."""
    for line in (_read(f"/proc/{pid}/status") or "").splitlines():
        if line.startswith("NSpid:"):
            return int(line.split()[-1])
    return None


def _device(tty_nr: int) -> tuple[int, int]:
    """A device number as /proc/<pid>/stat encodes it, as (major, minor)."""
    return (tty_nr >> 8) & 0xFFF, (tty_nr & 0xFF) | ((tty_nr >> 12) & 0xFFF00)


class TerminalProbe:
    """Answers for one shell on a terminal: ``launcher`` is the host pid the runtime
    started (bwrap, setsid, ...), ``shell_pid`` the shell's own ``$$``."""

    def __init__(self, launcher: int, shell_pid: int):
        self.launcher = launcher
        self.shell_pid = shell_pid
        self.arch = platform.machine()
        self._host_pid: int | None = None
        self._searched = False

    def host_pid(self) -> int | None:
        """The shell's pid in the host's /proc: the descendant of the launcher that
        calls itself ``shell_pid``. None where the shell is not among them (a
        container engine runs it under its own daemon)."""
        if not self._searched:
            self._searched = True
            for pid in [self.launcher, *_descendants(self.launcher, limit=64)]:
                if _innermost_pid(pid) == self.shell_pid:
                    self._host_pid = pid
                    break
        return self._host_pid

    def waiting_for_input(self) -> bool | None:
        """True: the foreground job is blocked reading the terminal. False: it is
        not (running, sleeping, waiting on something else). None: cannot tell."""
        shell = self.host_pid()
        if shell is None or self.arch not in _READS:
            return None
        fields = _stat_fields(shell)
        if fields is None:
            return None
        pgrp, tty_nr, foreground = int(fields[2]), int(fields[4]), int(fields[5])
        if tty_nr == 0 or foreground <= 0:
            return None
        if foreground == pgrp:  # the shell itself: a builtin such as `read`
            members = [shell]
        else:
            members = [
                pid
                for pid in _descendants(shell)
                if (stat := _stat_fields(pid)) is not None and int(stat[2]) == foreground
            ]
        if not members:
            return None
        verdicts = [self._reads_terminal(pid, _device(tty_nr)) for pid in members]
        if True in verdicts:
            return True
        return None if None in verdicts else False

    def _reads_terminal(self, pid: int, terminal: tuple[int, int]) -> bool | None:
        text = _read(f"/proc/{pid}/syscall")
        if text is None:
            return None  # exited just now, or not ours to read
        parts = text.split()
        if not parts or parts[0] == "running" or parts[0] == "-1":
            return False  # on a CPU, or blocked outside a system call (a page fault)
        number = int(parts[0])
        if number in _WAITS[self.arch]:
            return None
        if number not in _READS[self.arch] or len(parts) < 2:
            return False
        try:
            rdev = os.stat(f"/proc/{pid}/fd/{int(parts[1], 16)}").st_rdev
        except (OSError, ValueError):
            return None
        return (os.major(rdev), os.minor(rdev)) in (terminal, _TTY)


def looks_like_a_prompt(output: str) -> bool:
    """The output's fallback sign of a program waiting for input: it ends in a line
    without a newline (``name? ``, ``[Y/n] ``, ``>>> ``)."""
    return bool(output.strip()) and not output.endswith("\n")
