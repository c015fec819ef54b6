"""EVAL of a Harbor task, as Harbor's verifier does it, in the agent's environment once
nothing of the agent runs any more: ``tests/`` copied to ``/tests`` only now,
``tests/test.sh`` run (from the workdir, with ``[verifier]``'s env, bounded by its
``timeout_sec``), the reward read from ``/logs/verifier/reward.json`` (named
components) or, without it, ``reward.txt`` (a number).

Integrity: every process the agent left is killed first (``kill -KILL -1`` in the
sandbox's own PID namespace where commands share one; on bubblewrap each command has
its own, gone with it); ``/tests`` and ``/logs`` are emptied before the tests go in (a
reward or a test file the agent planted is never read); the test script runs with a
clean environment (the default PATH of read-only system folders, a fresh HOME, no
Python user site, no BASH_ENV), so a tool or module the agent planted in its HOME or
/tmp shadows nothing the tests call. A verifier that hangs, or uses up its CPU budget,
is the agent's failure (reward 0), never a mask; so is a missing or malformed reward
file (the agent may have broken what the tests read).

The scalar reward from ``reward.json`` (Harbor never reduces it): its ``reward`` key
if present, else its only component; with several components and no ``reward`` key the
reward is 0 and the evaluation says why (a mean would weigh parts the task never said
were comparable). The components go to the result's ``reward_components``.
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass, field
from typing import Any

from rollserve.errors import InfraError
from rollserve.handlers.harbor.folder import HarborTask, tar_of
from rollserve.sandbox.base import Sandbox

TAIL = 3000
KILL_ALL = "kill -KILL -1 2>/dev/null; true"
CLEAR = ("chmod -R u+rwX /tests /logs 2>/dev/null; find /tests /logs -mindepth 1 -delete "
         "2>/dev/null; mkdir -p /logs/verifier /logs/agent /logs/home && "
         "test -z \"$(find /tests /logs -mindepth 1 -not -path /logs/verifier -not -path /logs/agent "
         "-not -path /logs/home | head -1)\"")
READ = ("cd /logs/verifier && for f in reward.json reward.txt; do if [ -f $f ]; then echo \"== $f\"; "
        "head -c 65536 $f; exit 0; fi; done; echo '== none'")
CLEAN_ENV = {"HOME": "/logs/home", "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1",
             "BASH_ENV": "", "ENV": "", "LANG": "C.UTF-8"}


@dataclass
class Verdict:
    reward: float
    components: dict[str, float] | None = None
    details: dict[str, Any] = field(default_factory=dict)


async def verify(sandbox: Sandbox, task: HarborTask, workdir: str, env: dict[str, str],
                 timeout: float, *, shared_pids: bool) -> Verdict:
    """Run the task's tests in ``sandbox`` and read the reward (see the module's doc)."""
    if shared_pids:
        await sandbox.exec(KILL_ALL, timeout=30)
    cleared = await sandbox.exec(CLEAR, timeout=60)
    if not cleared.ok:
        return Verdict(0.0, details={"reason": "/tests or /logs could not be emptied of what the "
                                     "agent left there", "verifier_ran": False})
    tests = tar_of([(task.folder / "tests", ".")])
    copied = await sandbox.exec("tar -x --no-same-owner -C /tests -f - && chmod +x /tests/test.sh",
                                timeout=120, stdin=tests)
    if not copied.ok:
        raise InfraError(f"could not copy tests/ into the sandbox: {copied.failure()}")
    command = (f"cd {shlex.quote(workdir)} && exec /tests/test.sh "
               "> /logs/verifier/test-stdout.txt 2>&1")
    ran = await sandbox.exec(command, timeout=timeout, env={**env, **task.config.verifier.env,
                                                            **CLEAN_ENV},
                             cpu_budget=timeout)
    details: dict[str, Any] = {"verifier_ran": True, "verifier_exit_code": ran.exit_code,
                               "verifier_seconds": round(ran.seconds, 3)}
    log = await sandbox.exec("tail -c 3000 /logs/verifier/test-stdout.txt", timeout=30)
    details["test_output_tail"] = log.stdout[-TAIL:]
    if ran.timed_out or ran.cap is not None:
        why = "timed out" if ran.timed_out else f"was stopped by the sandbox's {ran.cap} cap"
        details["reason"] = f"the verifier {why} (charged to the agent)"
        return Verdict(0.0, details=details)
    read = await sandbox.exec(READ, timeout=30)
    return parse_reward(read.stdout, details)


def parse_reward(output: str, details: dict[str, Any]) -> Verdict:
    """The verdict from ``READ``'s output: ``== reward.json`` / ``== reward.txt`` / ``== none``
    then the file's text."""
    head, _, text = output.partition("\n")
    kind = head.removeprefix("== ").strip()
    details["reward_file"] = None if kind == "none" else kind
    if kind == "reward.txt":
        try:
            value = float(text.strip())
        except ValueError:
            return _zero(details, f"reward.txt is not a number: {text.strip()[:100]!r}")
        if not math.isfinite(value):
            return _zero(details, "reward.txt is not finite")
        return Verdict(value, details=details)
    if kind != "reward.json":
        return _zero(details, "the verifier wrote no reward file (/logs/verifier/reward.txt or "
                     "reward.json)")
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
    if "reward" in components:
        return Verdict(components["reward"], components, details)
    if len(components) == 1:
        return Verdict(next(iter(components.values())), components, details)
    details["reason"] = ("reward.json has several components and no 'reward' key: the scalar "
                         "reward is 0 (name the one to train on 'reward')")
    return Verdict(0.0, components, details)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(float(value))


def _zero(details: dict[str, Any], reason: str) -> Verdict:
    details["reason"] = reason
    return Verdict(0.0, details=details)
