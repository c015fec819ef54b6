"""The ``harness`` option of harness-driven handlers (the ``swe`` family's
``instance.harness``, the ``gateway`` family's ``instance.harness``): a preset
(``agent.harnesses``: one TOML file each) and its per-instance options, checked at
submit, then run in the rollout's sandbox behind the gateway (``handlers.harness``).

Instance field::

    "harness": {"preset": "codex"}
    "harness": {"preset": "mini-swe-agent", "config": ["swebench.yaml"]}
    "harness": {"preset": "command", "command": "<bash -c command>"}

Besides ``preset``: ``command`` (for a preset without one, such as ``command``),
``tool_calls`` (``hermes`` | ``none``; default the preset's) and the preset's own
``[options]``. At submit (``parse_harness``) the preset must exist and be installed
on this server, with a Node that fits: else a 422 naming ``instance.harness.preset``
and what to install (``rollserve harness install codex``), never a masked rollout
later; on an image runtime (docker, podman, apptainer) an npm preset also needs its
Node in the install folder (``--with-node``). ``binds``: the install folder, bound read-only into the sandbox at
``runner.INSTALL_INSIDE``. A runtime without paths of its own (``local``: no
/workspace, no private /tmp, no binds) runs no preset: a 422 naming
``instance.harness`` (``runtime_problem``).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from rollserve.agent.gateway import GatewaySession
from rollserve.agent.harnesses.base import TASK_ARGV_MAX, Preset, PresetFileError
from rollserve.agent.harnesses.install import (
    available,
    bundled_node,
    install_root,
    installed_problem,
    reach_problem,
)
from rollserve.agent.harnesses.runner import (
    HOME_INSIDE,
    INSTALL_INSIDE,
    TASK_FILE,
    harness_env,
    harness_script,
)
from rollserve.contract.validation import field_name
from rollserve.handlers.base import FirstPrompt, HandlerContext, InvalidInstance, RolloutView
from rollserve.handlers.harness import HarnessOutput, gateway_session, run_in_sandbox
from rollserve.handlers.sandboxed import python_with
from rollserve.sandbox.base import WORKDIR, Sandbox, SandboxError

__all__ = [
    "HarnessSpec",
    "harness_binds",
    "harness_first_prompt",
    "parse_harness",
    "run_preset",
    "runtime_problem",
    "task_size_problem",
]


@dataclass(frozen=True)
class HarnessSpec:
    """``instance.harness``, checked: the preset, the command to run, its options."""

    preset: Preset
    command: str
    tool_calls: Literal["hermes", "none"]
    options: dict[str, str | list[str]]
    folder: Path | None  # the install folder (npm presets)


class _Base(BaseModel):
    model_config = ConfigDict(extra="forbid")

    preset: str
    command: str | None = Field(
        None,
        min_length=1,
        description="the harness, run with bash -c in the workdir (for a preset without a command of its own)",
    )


def _model(preset: Preset) -> type[BaseModel]:
    """The pydantic model of ``instance.harness`` for ``preset`` (the latest few kept:
    an edited preset file is a new key, an old one falls out)."""
    return _model_of(preset.model_dump_json())


@functools.lru_cache(maxsize=64)
def _model_of(preset_json: str) -> type[BaseModel]:
    preset = Preset.model_validate_json(preset_json)
    fields: dict[str, Any] = {"tool_calls": (Literal["hermes", "none"], preset.tool_calls)}
    for key, option in preset.options.items():
        required = option.default is None
        if option.type == "list":
            fields[key] = (
                list[str],
                Field(
                    ... if required else list(option.default or []),
                    min_length=option.min_items,
                    description=option.description,
                ),
            )
        else:
            fields[key] = (
                str,
                Field(... if required else option.default, pattern=option.pattern, description=option.description),
            )
    return create_model(f"Harness_{preset.name.replace('-', '_')}", __base__=_Base, **fields)


def _root(ctx: HandlerContext) -> Path:
    return install_root(ctx.harness_dir)


# A preset found installed is taken as installed for this long: a submit's tasks
# naming one preset check its install (files, Node, folder modes) once, not each.
# A problem found is never kept (the next submit looks again, after an install).
CHECK_SECONDS = 2.0
_ready: dict[tuple[str, str, str], float] = {}  # (root, preset JSON, runtime) -> when found


def parse_harness(ctx: HandlerContext, raw: object, at: str = "instance.harness") -> HarnessSpec:
    """``raw`` (the instance's ``harness``) checked against its preset and this
    server's installs; ``InvalidInstance`` naming the field and what to do."""
    if not isinstance(raw, Mapping):
        raise InvalidInstance(at, 'an object naming its preset, e.g. {"preset": "codex"}')
    problem = runtime_problem(ctx)
    if problem is not None:
        raise InvalidInstance(at, problem)
    root = _root(ctx)
    try:
        known = available(root)
    except PresetFileError as error:  # the server's file, said as it is
        raise InvalidInstance(f"{at}.preset", str(error)) from None
    name = raw.get("preset")
    if not isinstance(name, str) or name not in known:
        raise InvalidInstance(
            f"{at}.preset", f"one of {', '.join(sorted(known))} (presets in {root / 'presets'} count too), got {name!r}"
        )
    preset = known[name]
    try:
        parsed = _model(preset).model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InvalidInstance(field_name((*at.split("."), *first["loc"])), first["msg"]) from None
    values = parsed.model_dump()
    command = values.pop("command")
    if preset.takes_command and command is None:
        raise InvalidInstance(at, f"preset {name!r} needs a command")
    if not preset.takes_command and command is not None:
        raise InvalidInstance(at, f"preset {name!r} builds its own command; leave command out")
    # The version installed now (the link resolved): a rollout keeps it, a later
    # install swapping the link does not change what its sandbox binds.
    folder = (root / name).resolve() if preset.package.kind == "npm" else None
    problem = _install_problem(ctx, preset, root, folder)
    if problem is not None:
        raise InvalidInstance(f"{at}.preset", problem)
    tool_calls = values.pop("tool_calls")
    values.pop("preset")
    return HarnessSpec(preset, command if command is not None else preset.run.command or "", tool_calls, values, folder)


def runtime_problem(ctx: HandlerContext) -> str | None:
    """Why no preset can run on this server's sandbox runtime, if so: every preset
    runs in the workdir /workspace with its HOME and task file in the sandbox's
    private /tmp (npm presets: from the install folder bound read-only), which a
    runtime without paths of its own (local: commands on the host's paths) lacks."""
    if ctx.sandboxes is None or ctx.sandboxes.own_paths:
        return None
    return (
        f"the {ctx.sandboxes.name} runtime runs commands on this machine's own paths, and "
        f"a harness preset needs a sandbox with paths of its own: the workdir {WORKDIR}, "
        f"its HOME and task file in a private /tmp ({HOME_INSIDE}), an npm preset's "
        f"install folder bound read-only at {INSTALL_INSIDE}; serve with "
        "--sandbox-runtime bubblewrap (or apptainer, docker, podman)"
    )


def _install_problem(ctx: HandlerContext, preset: Preset, root: Path, folder: Path | None) -> str | None:
    """Why ``preset`` cannot run here (``installed_problem``, the folder's modes, an
    image runtime's Node); a success is kept ``CHECK_SECONDS``."""
    runtime = ctx.sandboxes.name if ctx.sandboxes is not None else ""
    key = (str(root), preset.model_dump_json(), runtime)
    now = time.monotonic()
    if now - _ready.get(key, -CHECK_SECONDS - 1) <= CHECK_SECONDS:
        return None
    problem = installed_problem(preset, root)
    if problem is None and folder is not None and _bubblewrap(ctx):
        problem = reach_problem(folder)
    if problem is None and folder is not None:
        problem = _image_node_problem(ctx, preset.name, folder)
    if problem is None:
        if len(_ready) > 256:
            _ready.clear()
        _ready[key] = now
    return problem


def harness_first_prompt(ctx: HandlerContext, raw: object, at: str = "instance.harness") -> FirstPrompt | None:
    """The first prompt's size ``raw``'s preset declares (``[prompt]``), if it does;
    ``raw`` is the instance's ``harness``, already checked by ``parse_harness``."""
    if not isinstance(raw, Mapping):
        return None
    preset = available(_root(ctx)).get(str(raw.get("preset")))
    if preset is None or preset.prompt is None:
        return None
    size = preset.prompt
    measured = ", ".join(f"{tokens:,} with {name}" for name, tokens in size.measured.items())
    if size.harness_version is not None:
        measured = f"{preset.name} {size.harness_version}" + (f": {measured}" if measured else "")
    return FirstPrompt(f"{at}.preset", size.first_tokens, f"{preset.name}'s first prompt", measured)


IMAGE_RUNTIMES = ("docker", "podman", "apptainer", "singularity")


def _image_node_problem(ctx: HandlerContext, name: str, folder: Path) -> str | None:
    """On an image runtime the sandbox sees the install folder, not the host's node,
    and an image need not have one: an npm preset needs its Node bundled there."""
    runtime = ctx.sandboxes.name if ctx.sandboxes is not None else None
    if runtime not in IMAGE_RUNTIMES or bundled_node(folder) is not None:
        return None
    return (
        f"on the {runtime} runtime the {name} harness runs on the Node in its install "
        f"folder ({folder} has none; the image's and this machine's are not used): run "
        f"`rollserve harness install {name} --with-node`"
    )


def _bubblewrap(ctx: HandlerContext) -> bool:
    return ctx.sandboxes is not None and ctx.sandboxes.name == "bubblewrap"


def harness_binds(spec: HarnessSpec | None) -> dict[str, str]:
    """The sandbox's read-only binds for ``spec``'s harness (its install folder)."""
    if spec is None or spec.folder is None:
        return {}
    return {INSTALL_INSIDE: str(spec.folder)}


def task_size_problem(spec: HarnessSpec | None, text: str) -> str | None:
    """Why ``text`` cannot be ``spec``'s task (its preset passes the task as one
    argument, ``[run] task_in_argv``, and Linux refuses one over 128 KiB), if so."""
    if spec is None or not spec.preset.run.task_in_argv:
        return None
    size = len(text.encode("utf-8"))
    if size <= TASK_ARGV_MAX:
        return None
    return (
        f"{size:,} bytes: the {spec.preset.name} harness takes the task as one command-line "
        f"argument, at most {TASK_ARGV_MAX:,} bytes (a preset reading it from "
        "$ROLLSERVE_TASK_FILE has no such limit)"
    )


async def _write_task(sandbox: Sandbox, task: str) -> None:
    """The task's text into ``TASK_FILE`` (in the sandbox's private /tmp, outside the
    workdir), through stdin: no argument or environment variable holds it."""
    wrote = await sandbox.exec(f"mkdir -p {HOME_INSIDE} && cat > {TASK_FILE}", timeout=60, stdin=task.encode("utf-8"))
    if not wrote.ok:
        raise SandboxError(f"could not write the harness's task file {TASK_FILE}: {wrote.failure()}")


async def run_preset(
    ctx: HandlerContext,
    rollout: RolloutView,
    sandbox: Sandbox,
    spec: HarnessSpec,
    env: Mapping[str, str],
    *,
    task: str | None = None,
    task_file: str | None = None,
    workdir: str = WORKDIR,
    on_session: Callable[[GatewaySession], None] | None = None,
) -> HarnessOutput:
    """``spec``'s harness in ``sandbox`` behind the rollout's gateway session, until it
    exits, ``max_turns`` or the time limit; its output. ``env``: the agent's own
    environment (host mode's python shims...); the task is ``task`` (its text) or
    already in ``task_file``; it runs in ``workdir``; ``on_session`` is told the session once it is open."""
    package = spec.preset.package
    python, extra = await python_with(
        sandbox, package.module if package.kind == "python" and package.module else "asyncio"
    )
    if task is not None:
        await _write_task(sandbox, task)
    files = {"task_file": task_file} if task_file is not None else {}
    run_env = harness_env(spec.preset, workdir=workdir, max_turns=rollout.max_turns, options=spec.options, **files)
    script = harness_script(
        spec.preset,
        spec.command,
        installed=spec.folder is not None,
        bundled_node=spec.folder is not None and bundled_node(spec.folder) is not None,
    )
    output = HarnessOutput()
    declared = spec.preset.calls
    calls = None if declared is None else declared.gateway_calls()
    async with gateway_session(ctx, rollout, parse_tool_calls=spec.tool_calls == "hermes", calls=calls) as (
        session,
        key,
    ):
        if on_session is not None:
            on_session(session)
        try:
            await run_in_sandbox(sandbox, session, key, script, python, {**extra, **env, **run_env}, output)
        finally:
            if output.exit_code is not None:
                rollout.add_stats({"harness_exit_code": output.exit_code})
    return output
