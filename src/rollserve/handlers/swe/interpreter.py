"""Whether a SWE task's environment can start its tests: checked before anything is
scored, since an environment that cannot start them is infrastructure, never a 0.

- **At server start** (host mode, a ``python`` option that is a path): the path, what
  it resolves to and a venv's base interpreter (``home`` in its ``pyvenv.cfg``) must
  exist and not lie in a folder host-mode sandboxes do not see (the runtime's hidden
  folders, less what it binds back; the handler's own; the private /tmp), else the
  server does not start (``static_problem``).
- **At INIT** and **at EVAL** (``probe``): in the task's sandbox, with the
  environment its tests get (host mode: the ``python`` shims; image mode: the image's
  activation), the test command's program is found (``command -v``; a script's
  ``#!`` interpreter too), each Python it runs starts (``python -c 'import sys;
  print(sys.version)'``) and, where the command runs pytest, imports it. A failure is
  an ``InfraError`` (masked) naming the interpreter's origin (the ``python`` option
  and its path, the python found in the sandbox, or the image's environment).

At EVAL the probe runs in the fresh sandbox *before* the candidate patch is applied:
nothing of the candidate exists there yet, so nothing it does can change the probe's
outcome. That outcome is the only evidence of a missing runner: a test run that
exits 127 after a passing probe (the candidate's code deleted the interpreter's shim,
or called ``exit(127)``) is graded like any other failure, and never masked.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from pathlib import Path

from rollserve.errors import InfraError
from rollserve.handlers.swe.evaluate import suite_command
from rollserve.handlers.swe.grade import START
from rollserve.handlers.swe.instances import SWETask
from rollserve.sandbox.base import Sandbox

PROBE_TIMEOUT = 120.0
_PYTHON = re.compile(r"^python(\d+(\.\d+)*)?$")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


# --- at server start: the option's path, as the host shows it --------------------------
def _within(path: Path, folders: Sequence[str]) -> str | None:
    for folder in folders:
        if path == Path(folder) or Path(folder) in path.parents:
            return folder
    return None


def static_problem(python: str, hidden: Sequence[str], shown: Sequence[str]) -> str | None:
    """Why the ``python`` option (an absolute path on the host root) cannot run in a
    host-mode sandbox that hides ``hidden`` but shows ``shown`` again; None if it may."""
    given = Path(python)
    if not given.is_absolute():
        return None  # a name looked up on the sandbox's PATH: only a sandbox can tell
    if not given.exists():
        return f"{python} does not exist"
    paths = {"the path": given, "its target": given.resolve()}
    cfg = next((p / "pyvenv.cfg" for p in (given.parent, given.parent.parent) if (p / "pyvenv.cfg").is_file()), None)
    if cfg is not None:
        for line in cfg.read_text(errors="replace").splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "home" and value.strip():
                home = Path(value.strip())
                if not home.is_dir():
                    return f"{python} is a venv whose base interpreter's folder {home} is gone"
                paths["its venv's base interpreter"] = home.resolve()
    for what, path in paths.items():
        folder = _within(path, hidden)
        if folder is not None and _within(path, shown) is None:
            return f"{python}: {what} ({path}) lies in {folder}, a folder host-mode sandboxes do not see"
    return None


# --- in a sandbox: the test command's programs ----------------------------------------
def command_of(task: SWETask) -> str | None:
    """The command that runs the task's tests (for a dataset's own eval_script, the
    first command after its start marker; None if there is none)."""
    if task.eval_script:
        lines = task.eval_script.splitlines()
        start = next((i for i, line in enumerate(lines) if START in line), None)
        if start is None:
            return None
        return next(
            (line for line in lines[start + 1 :] if line.strip() and not line.lstrip().startswith(("#", ":", "echo "))),
            None,
        )
    if task.schema == "r2e-gym":
        return task.test_cmd or "bash run_tests.sh"
    return suite_command(task)


def command_words(command: str) -> list[str]:
    """The command's words from its program on (past ``VAR=value`` and ``env``)."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    while words and (_ASSIGNMENT.match(words[0]) or words[0] == "env"):
        words.pop(0)
    return words


def shebang_words(first_line: str) -> list[str]:
    """The interpreter a ``#!`` line runs (``/usr/bin/env python`` -> ``python``)."""
    if not first_line.startswith("#!"):
        return []
    words = command_words(first_line[2:].strip())
    if words and Path(words[0]).name == "env":
        words = command_words(" ".join(words[1:]))
    return words[:1]


async def probe_script(sandbox: Sandbox, task: SWETask, activate: str | None, host: bool) -> str:
    """The bash script that checks the task's test command can start (see the doc)."""
    command = command_of(task) or ""
    words = command_words(command)
    programs: list[str] = words[:1]
    program = words[0] if words else ""
    if "/" in program and not program.startswith("/") and ".." not in program:
        try:
            first = (await sandbox.read_file(program)).split(b"\n", 1)[0]
            programs += shebang_words(first.decode(errors="replace"))
        except OSError:  # (PermissionError: outside the workspace)
            if program.removeprefix("./") in task.test_files:
                programs = []  # the test patch brings it
    pythons = [p for p in programs if _PYTHON.match(Path(p).name)]
    if host and "python" not in pythons:
        pythons.insert(0, "python")  # the interpreter the shims run, for tests and agent
    pytest = None
    if "pytest" in words[1:] and "-m" in words:
        pytest = words[words.index("-m") - 1] if words.index("-m") > 0 else "python"
    elif host and Path(program).name in ("pytest", "py.test"):
        pytest = "python"
    lines = [activate] if activate else []
    for word in dict.fromkeys(programs):
        lines.append(
            f"command -v -- {shlex.quote(word)} >/dev/null 2>&1 || "
            f"{{ echo {shlex.quote(f'{word}: command not found')}; exit 127; }}"
        )
    for python in dict.fromkeys(pythons):
        lines.append(
            f"{shlex.quote(python)} -c 'import sys; print(sys.version)' || "
            f"{{ echo {shlex.quote(f'{python} does not start')}; exit 127; }}"
        )
    if pytest:
        lines.append(
            f"{shlex.quote(pytest)} -c 'import pytest' || "
            f"{{ echo {shlex.quote(f'{pytest} cannot import pytest')}; exit 1; }}"
        )
    return "\n".join(lines) + "\n"


async def probe(
    sandbox: Sandbox, task: SWETask, env: dict[str, str] | None, activate: str | None, origin: str, when: str
) -> None:
    """InfraError (masked) if the task's tests cannot start in ``sandbox`` (see the
    module's doc); ``origin`` says where the interpreter comes from, ``when`` the stage."""
    script = await probe_script(sandbox, task, activate, host=activate is None)
    result = await sandbox.exec(["bash", "-c", "exec 2>&1\n" + script], timeout=PROBE_TIMEOUT, env=env)
    if result.ok:
        return
    why = "timed out" if result.timed_out else (result.stdout + result.stderr).strip()[-800:]
    raise InfraError(f"{when}: the environment of {task.instance_id} cannot start its tests ({origin}): {why}")
