"""EVAL of a Harbor task, as Harbor's verifier does it, in the agent's environment once
nothing of the agent runs any more: ``tests/`` copied to ``/tests`` only now,
``tests/test.sh`` run (from the workdir, with ``[verifier]``'s env, bounded by its
``timeout_sec``), the reward read from ``/logs/verifier/reward.json`` (named
components) or ``reward.txt`` (a number); both: the lower reward.

Integrity: every process the agent's shells left is killed first (``kill -KILL -1`` in
the sandbox's own PID namespace where commands share one; on bubblewrap each command
has its own, gone with it); ``/tests`` and ``/logs`` are emptied before the tests go in (a
reward or a test file the agent planted is never read); the test script runs with a
clean environment (the default PATH of read-only system folders, a fresh HOME, no
Python user site, no BASH_ENV), so a tool or module the agent planted in its HOME or
/tmp shadows nothing the tests call. A verifier that hangs, or uses up its CPU budget,
is the agent's failure (reward 0), never a mask; so is a missing or malformed reward
file (the agent may have broken what the tests read).

The tests may run the agent's code (its Makefile, its script, its library), which runs
with the verifier's rights and could write a reward file itself. So the reward files
are read only when test.sh exited on its own (not killed by a signal, its wrapper not
killed either), when no process it started still ran as it ended (each is killed; one
could have rewritten the reward after test.sh's write; a process whose main thread
exited while another runs shows as a zombie in /proc and counts as running), when
test.sh itself was not
written to, replaced or removed while it ran (its inode and ctime, which no write can
hide), when no file of the tests still there was changed, and when each reward file is
a regular, writable file (not a link, a folder, or one made read-only so that
test.sh's write fails); otherwise the reward is 0 and the evaluation says why. The
reward files and the tests' digests are read by a second command once the verifier's
has ended: on bubblewrap its PID namespace, and every thread in it, is gone by then;
where commands share one, ``kill -KILL -1`` runs first (a process the scan could not
see, started again by none, is dead; the scan's count is what scores it 0). With
both reward.json and reward.txt the lower reward counts. Left open: code of the
agent's that writes the very file test.sh writes and then makes test.sh end early
without a signal (a ``set -e`` script whose next step fails) is not told apart.
Nor is code that takes control of test.sh's process, which it may as the same uid:
ptrace it or write its /proc/PID/mem (both checked allowed on bubblewrap: the sandboxes
filter no system calls), or lower its open-files limit with prlimit so that its own
write fails without a signal after the code wrote the reward. Closing that needs the
runtime to run test.sh with credentials its children do not share.

The scalar reward from ``reward.json`` (Harbor never reduces it): its ``reward`` key
if present, else its only component; with several components and no ``reward`` key the
reward is 0 and the evaluation says why (a mean would weigh parts the task never said
were comparable). The components go to the result's ``reward_components``; the names
rollserve's judge writes there (``outcome``, ``judge``, ``judge_process``) are refused
in ``reward.json`` (reward 0, the evaluation says why) rather than silently overwritten.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import math
import secrets
import shlex
from dataclasses import dataclass, field
from typing import Any

from rollserve.errors import InfraError
from rollserve.handlers.harbor.folder import HarborTask, tar_of
from rollserve.sandbox.base import Sandbox

TAIL = 3000
KILL_ALL = "kill -KILL -1 2>/dev/null; true"
CLEAR = (
    "chmod -R u+rwX /tests /logs 2>/dev/null; find /tests /logs -mindepth 1 -delete "
    "2>/dev/null; mkdir -p /logs/verifier /logs/agent /logs/home && "
    'test -z "$(find /tests /logs -mindepth 1 -not -path /logs/verifier -not -path /logs/agent '
    '-not -path /logs/home | head -1)"'
)
# The verifier's run, in the sandbox (bash; after test.sh, builtins only until every
# process it left is dead): test.sh run as a child, so that its exit status is known
# (killed by a signal: over 128) and test.sh's inode and ctime (GNU find; else stat's
# seconds) before and after; then every process of the sandbox but this script, its
# ancestors and zombies (a zombie leader with threads still running is no zombie: the
# KILL of its pid ends them all) is counted and SIGKILLed (until none is left). Each
# line is behind a nonce read from stdin (a process of the agent's that wrote into this
# script's stdout cannot forge a line); STATUS is its last line.
RUN = r"""read -r nonce
ancestors=" 1 $$ "; p=$$
while [ "$p" -gt 1 ] 2>/dev/null; do
  read -r stat < /proc/$p/stat || break; set -- ${stat##*) }; p=$2; ancestors="$ancestors$p "
done
stamp() { find /tests/test.sh -printf '%i %C@' 2>/dev/null || stat -c '%i %Z' /tests/test.sh 2>/dev/null; }
script=$(stamp)
/tests/test.sh > /logs/verifier/test-stdout.txt 2>&1 < /dev/null
status=$?
survivors=0
for ((round = 0; round < 100; round++)); do
  left=""
  for d in /proc/[0-9]*; do
    q=${d#/proc/}
    case "$ancestors" in *" $q "*) continue ;; esac
    read -r stat < "$d/stat" 2>/dev/null || continue
    set -- ${stat##*) }
    if [ "$1" = Z ] || [ "$1" = X ]; then  # a zombie, unless its leader alone exited
      threads=("$d"/task/*); [ "${#threads[@]}" -gt 1 ] || continue
    fi
    left="$left $q"
  done
  [ -z "$left" ] && break
  set -- $left; [ "$round" = 0 ] && survivors=$#
  kill -KILL $left 2>/dev/null
done
say() { echo "$nonce $*"; }
say SURVIVORS $survivors
if [ -n "$left" ]; then say UNKILLED; fi
[ "$(stamp)" = "$script" ] || say SCRIPT changed
say STATUS $status"""
# Read once the verifier's command has ended (on bubblewrap: its PID namespace, every
# thread in it, gone with it): the tests' digests and the reward files.
READ = r"""read -r nonce
say() { echo "$nonce $*"; }
(cd /tests && find . -type f -exec sha256sum {} + 2>/dev/null) | while read -r line; do say SUM "$line"; done
v=/logs/verifier
if [ -L $v ] || [ ! -d $v ]; then say BAD $v is a link or no folder; fi
for f in reward.json reward.txt; do
  if [ -L $v/$f ]; then say BAD $v/$f is a link
  elif [ -e $v/$f ] && [ ! -f $v/$f ]; then say BAD $v/$f is no regular file
  elif [ -f $v/$f ] && [ ! -w $v/$f ]; then say BAD $v/$f was made read-only
  elif [ -f $v/$f ]; then say FILE $f "$(head -c 65536 $v/$f | base64 | tr -d '\n')"
  fi
done
say END"""
CLEAN_ENV = {
    "HOME": "/logs/home",
    "PYTHONNOUSERSITE": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
    "BASH_ENV": "",
    "ENV": "",
    "LANG": "C.UTF-8",
}


@dataclass
class Verdict:
    reward: float
    components: dict[str, float] | None = None
    details: dict[str, Any] = field(default_factory=dict)


async def verify(
    sandbox: Sandbox,
    task: HarborTask,
    workdir: str,
    env: dict[str, str],
    timeout: float,
    *,
    end: float | None = None,
    margin: float = 30.0,
    shared_pids: bool,
) -> Verdict:
    """Run the task's tests in ``sandbox`` and read the reward (see the module's doc).
    The tests run at most ``timeout`` seconds, and end ``margin`` seconds (at most half
    the time left) before ``end`` (loop time: EVAL's limit) so that a hang is scored."""
    if shared_pids:
        await sandbox.exec(KILL_ALL, timeout=30)
    cleared = await sandbox.exec(CLEAR, timeout=60)
    if not cleared.ok:
        return Verdict(
            0.0,
            details={
                "reason": "/tests or /logs could not be emptied of what the agent left there",
                "verifier_ran": False,
            },
        )
    tests = await asyncio.to_thread(tar_of, [(task.folder / "tests", ".")])
    copied = await sandbox.exec(
        "tar -x --no-same-owner -C /tests -f - && chmod +x /tests/test.sh", timeout=120, stdin=tests
    )
    if not copied.ok:
        raise InfraError(f"could not copy tests/ into the sandbox: {copied.failure()}")
    digests = await asyncio.to_thread(test_digests, task)
    command = f"cd {shlex.quote(workdir)} || exit 97\n{RUN}"
    nonce = secrets.token_hex(16)
    timeout = capped(timeout, end, margin)
    ran = await sandbox.exec(
        command,
        timeout=timeout,
        env={**env, **task.config.verifier.env, **CLEAN_ENV},
        cpu_budget=timeout,
        stdin=f"{nonce}\n".encode(),
    )
    details: dict[str, Any] = {"verifier_ran": True, "verifier_seconds": round(ran.seconds, 3)}
    log = await sandbox.exec("tail -c 3000 /logs/verifier/test-stdout.txt", timeout=30)
    details["test_output_tail"] = log.stdout[-TAIL:]
    if ran.timed_out or ran.cap is not None:
        why = "timed out" if ran.timed_out else f"was stopped by the sandbox's {ran.cap} cap"
        details["reason"] = f"the verifier {why} (charged to the agent)"
        return Verdict(0.0, details=details)
    if shared_pids:  # whatever the scan missed dies before the files are read
        await sandbox.exec(KILL_ALL, timeout=30)
    read = await sandbox.exec(READ, timeout=60, stdin=f"{nonce}\n".encode())
    if not read.ok:
        raise InfraError(f"could not read the verifier's results: {read.failure()}")
    report = Report.parse(f"{ran.stdout}\n{read.stdout}", nonce)
    if "END" not in report.flags:
        raise InfraError("the verifier's results were not read whole")
    details["verifier_exit_code"] = report.status
    problem = report.problem(digests)
    if problem is not None:
        return _zero(details, problem)
    return read_rewards(report.files, details)


def capped(timeout: float, end: float | None, margin: float) -> float:
    """``timeout``, shortened to end ``margin`` seconds (at most half the time left)
    before ``end`` (loop time; None: no end); at least 0.5 s."""
    if end is None:
        return timeout
    left = end - asyncio.get_running_loop().time()
    return max(0.5, min(timeout, left - min(margin, left / 2)))


def test_digests(task: HarborTask) -> dict[str, str]:
    """sha256 of each file of the task's tests/, by its path under /tests."""
    base = task.folder / "tests"
    return {
        "./" + path.relative_to(base).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(base.rglob("*"))
        if path.is_file() and not path.is_symlink()
    }


@dataclass
class Report:
    """What ``RUN`` printed: test.sh's exit status, the processes it left, the reward
    files (``ok`` and their text, or why they are not read), the digests of /tests."""

    status: int | None = None
    survivors: int = 0
    files: dict[str, str] = field(default_factory=dict)
    bad: list[str] = field(default_factory=list)
    digests: dict[str, str] = field(default_factory=dict)
    flags: set[str] = field(default_factory=set)  # END, UNKILLED, SCRIPT (changed)

    @classmethod
    def parse(cls, output: str, nonce: str) -> Report:
        report = cls()
        for line in output.splitlines():
            mark, _, line = line.partition(" ")
            if mark != nonce:
                continue
            word, _, rest = line.partition(" ")
            if word == "STATUS" and rest.strip().isdigit():
                report.status = int(rest)
            elif word == "SURVIVORS" and rest.strip().isdigit():
                report.survivors = int(rest)
            elif word == "FILE":
                name, _, text = rest.partition(" ")
                report.files[name] = base64.b64decode(text).decode("utf-8", "replace")
            elif word == "BAD":
                report.bad.append(rest)
            elif word == "SUM":
                digest, _, path = rest.partition("  ")
                report.digests[path] = digest
            else:
                report.flags.add(word)
        return report

    def problem(self, digests: dict[str, str]) -> str | None:
        """Why the reward files are not read (the reward is 0), or None."""
        if "END" not in self.flags or self.status is None:  # (STATUS: the run's last line)
            return "the verifier was killed before it ended (by a process test.sh ran): the reward files are not read"
        if self.status > 128:
            return (
                f"test.sh was killed by signal {self.status - 128} (exit status "
                f"{self.status}), by a process it ran: the reward files are not read"
            )
        if self.survivors or "UNKILLED" in self.flags:
            return (
                f"{self.survivors} process(es) started during verification still ran when "
                "test.sh ended (they could rewrite the reward after it): killed, the reward "
                "files not read"
            )
        if "SCRIPT" in self.flags:
            return (
                "test.sh was written to, replaced or removed while it ran (by a process it "
                "ran): the reward files are not read"
            )
        changed = sorted(
            path for path, digest in digests.items() if self.digests.get(path, digest) != digest
        )  # (removed: the tests' own)
        if changed:
            return (
                f"the tests were changed during verification ({changed[0].removeprefix('./')}):"
                " the reward files are not read"
            )
        if self.bad:
            return f"{self.bad[0]} (not as test.sh writes it): the reward files are not read"
        return None


def read_rewards(files: dict[str, str], details: dict[str, Any]) -> Verdict:
    """The verdict from the reward files' texts (``reward.json``, ``reward.txt``). Both
    there: the lower scalar counts (a process test.sh ran may have written the one
    test.sh did not; the components are reward.json's)."""
    details["reward_file"] = " and ".join(sorted(files, reverse=True)) or None
    verdicts = [parse_reward(name, files[name], details) for name in ("reward.json", "reward.txt") if name in files]
    if not verdicts:
        return _zero(details, "the verifier wrote no reward file (/logs/verifier/reward.txt or reward.json)")
    if len(verdicts) == 2 and verdicts[0].reward != verdicts[1].reward:
        details.setdefault("reason", "reward.json and reward.txt disagree: the lower counts")
    low = min(verdicts, key=lambda verdict: verdict.reward)
    return Verdict(low.reward, verdicts[0].components, details)


def parse_reward(kind: str, text: str, details: dict[str, Any]) -> Verdict:
    """The verdict from one reward file's text: ``reward.txt`` a number, ``reward.json``
    a number or an object of named numbers."""
    if kind == "reward.txt":
        try:
            value = float(text.strip())
        except ValueError:
            return _zero(details, f"reward.txt is not a number: {text.strip()[:100]!r}")
        if not math.isfinite(value):
            return _zero(details, "reward.txt is not finite")
        return Verdict(value, details=details)
    return _from_json(text, details)


def _from_json(text: str, details: dict[str, Any]) -> Verdict:
    try:
        data = json.loads(text)
    except ValueError:
        return _zero(details, "reward.json is not JSON")
    if _number(data):
        return Verdict(float(data), details=details)
    if not isinstance(data, dict) or not data:
        return _zero(details, "reward.json is neither a number nor an object of numbers")
    bad = [key for key, value in data.items() if not _number(value)]
    if bad:
        return _zero(details, f"reward.json: {bad[0]!r} is not a finite number")
    components = {str(key): float(value) for key, value in data.items()}
    taken = sorted(RESERVED_COMPONENTS & components.keys())
    if taken:
        return _zero(
            details,
            f"reward.json: {taken[0]!r} is a component name rollserve's judge "
            f"writes ({', '.join(sorted(RESERVED_COMPONENTS))}): rename it in test.sh",
        )
    if "reward" in components:
        return Verdict(components["reward"], components, details)
    if len(components) == 1:
        return Verdict(next(iter(components.values())), components, details)
    details["reason"] = (
        "reward.json has several components and no 'reward' key: the scalar "
        "reward is 0 (name the one to train on 'reward')"
    )
    return Verdict(0.0, components, details)


RESERVED_COMPONENTS = frozenset({"outcome", "judge", "judge_process"})


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(float(value))


def _zero(details: dict[str, Any], reason: str) -> Verdict:
    details["reason"] = reason
    return Verdict(0.0, details=details)
