"""SandboxLimits as rlimits, and where each one can be trusted.

rlimits are per process, set on the first process of a sandbox and inherited:

- RLIMIT_AS (memory_mb): address space *per process*, not per sandbox. It also
  breaks programs that reserve much more than they use (Go, JVMs, Node, Bun); where a
  cgroup v2 memory controller is available it is used instead (see cgroups.py), and
  a spec with ``memory_mode="resident"`` gets the resident memory cap for the whole
  sandbox instead (rsscap.py).
- RLIMIT_NPROC (pids): counted per (user namespace, uid). The kernel exempts real
  uid 0 from it entirely, so as root it does nothing; for a plain user outside a
  user namespace it counts *every* process of that user on the host (so it is
  unusable there: the server's own processes use up the limit). Set inside a fresh
  user namespace (bwrap as a non-root uid) it counts exactly the sandbox's
  processes — that is how the bubblewrap runtime uses it. See bubblewrap.py.
- RLIMIT_FSIZE, RLIMIT_CPU, RLIMIT_NOFILE: per process, fine everywhere.
- RLIMIT_CORE = 0: a crashing program does not leave core files in the workspace.
"""

from __future__ import annotations

import resource

from rollserve.sandbox.base import SandboxLimits

MB = 1 << 20


def resident_cap(limits: SandboxLimits, *, bounded: bool) -> bool:
    """Whether a sandbox with ``limits`` gets the resident memory cap (rsscap.py)
    instead of RLIMIT_AS: it asks for it, and nothing else (``bounded``: a cgroup)
    bounds its memory as a whole."""
    return limits.memory_mode == "resident" and not bounded


def rlimits(limits: SandboxLimits, *, nproc: bool, address_space: bool = True) -> dict[int, int]:
    """The rlimits (soft = hard) for ``limits``: RLIMIT_* -> value; RLIMIT_AS only
    with ``address_space`` and a spec whose ``memory_mode`` is "address-space"."""
    values = {
        resource.RLIMIT_FSIZE: limits.file_size_mb * MB,
        resource.RLIMIT_CPU: limits.cpu_seconds,
        resource.RLIMIT_NOFILE: limits.open_files,
        resource.RLIMIT_CORE: 0,
    }
    if address_space and limits.memory_mode == "address-space":
        values[resource.RLIMIT_AS] = limits.memory_mb * MB
    if nproc:
        values[resource.RLIMIT_NPROC] = limits.pids
    # An unprivileged process cannot raise a hard limit: never ask for more than ours.
    for which, value in values.items():
        hard = resource.getrlimit(which)[1]
        if hard != resource.RLIM_INFINITY and value > hard:
            values[which] = hard
    return values


_PRLIMIT_FLAGS = {
    resource.RLIMIT_FSIZE: "--fsize",
    resource.RLIMIT_CPU: "--cpu",
    resource.RLIMIT_NOFILE: "--nofile",
    resource.RLIMIT_CORE: "--core",
    resource.RLIMIT_AS: "--as",
    resource.RLIMIT_NPROC: "--nproc",
}


def prlimit_argv(values: dict[int, int]) -> list[str]:
    """util-linux ``prlimit`` in front of a command: the limits are set in the child
    without a ``preexec_fn`` (which would make CPython fork instead of vfork)."""
    return ["prlimit", *(f"{_PRLIMIT_FLAGS[r]}={v}" for r, v in values.items()), "--"]


# How each limit is enforced, for Runtime.caps() (the runtimes say which apply).
PER_PROCESS = {
    "file_size_mb": "RLIMIT_FSIZE: per file, a write past it fails (SIGXFSZ)",
    "cpu_seconds": "RLIMIT_CPU: per process (SIGXCPU, then SIGKILL)",
    "open_files": "RLIMIT_NOFILE: per process",
}
MEMORY_PER_PROCESS = "RLIMIT_AS: address space per process, NOT per sandbox (several processes may together use more)"


def apply(pid: int, values: dict[int, int]) -> None:
    """Set the limits on a running (e.g. blocked, not yet exec'd) process."""
    for which, value in values.items():
        resource.prlimit(pid, which, (value, value))
