"""Harness presets: an agent harness rollserve did not write (Codex, Claude Code,
mini-swe-agent...) described declaratively, one TOML file per preset in
``agent/harnesses/presets/<name>.toml`` (docs/harnesses.md has the format).

- ``Preset`` and its tables (``Package``, ``Run``, ``Option``): the file's schema,
  checked with pydantic (unknown keys refused); ``load_preset(path)`` reads one file,
  ``PresetFileError`` naming the file and the key at fault.
- ``presets()``: every preset file of a folder (the bundled one by default), by name,
  read once per folder; no list of names is written anywhere else.

Beyond the agreed keys (name, summary, wire, tool_calls, [package], [run], [env],
[files]) a preset may declare ``[options.<key>]``: per-instance settings a trainer
may pass in ``instance.harness`` (mini-swe-agent's ``config``, say), each exposed to
the command as ``$ROLLSERVE_OPT_<KEY>`` (a list as shell words); and
``[package] module`` / ``pip`` for python presets (the module the sandbox's python
must import; what to pip install when it cannot); ``[calls]`` (its auxiliary calls);
``[prompt]`` (its first prompt's size in tokens, checked against a rollout's window
at submit).
"""

from __future__ import annotations

import functools
import re
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rollserve.agent.gateway.base import POLICY_MODEL
from rollserve.agent.harnesses.semver import check_range
from rollserve.contract.calls import GatewayCalls

__all__ = [
    "PRESETS_DIR",
    "TASK_ARGV_MAX",
    "Option",
    "Package",
    "Preset",
    "PresetFileError",
    "PromptSize",
    "Run",
    "load_preset",
    "presets",
]

PRESETS_DIR = Path(__file__).parent / "presets"
NAME = r"^[a-z0-9][a-z0-9-]{0,39}$"
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Set by the runner: a preset's [env] may not override them.
RESERVED_ENV = frozenset(
    {
        "HOME",
        "PATH",
        "OPENAI_BASE_URL",
        "ANTHROPIC_BASE_URL",
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
        "ROLLSERVE_PYTHON",
        "ROLLSERVE_TASK_FILE",
        "ROLLSERVE_MODEL",
        "ROLLSERVE_MAX_TURNS",
    }
)


class PresetFileError(ValueError):
    """A preset file that cannot be used: names the file and the key at fault."""

    def __init__(self, path: Path, key: str, problem: str) -> None:
        self.path, self.key, self.problem = path, key, problem
        super().__init__(f"harness preset {path}: {key}: {problem}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Package(_Strict):
    """What the harness is and where it comes from."""

    kind: Literal["npm", "python", "none"]
    name: str | None = Field(None, description="npm: the package; python: the distribution")
    versions: str = Field("*", description="npm range of the package's versions")
    node: str | None = Field(None, description="npm: the Node range it needs")
    bin: str | None = Field(None, description="npm: its executable under node_modules/.bin")
    module: str | None = Field(
        None, description="python: the module the sandbox's python must import (the command runs on that python)"
    )
    pip: str | None = Field(None, description="python: what to pip install when it is missing")

    @field_validator("versions", "node")
    @classmethod
    def _a_range(cls, value: str | None) -> str | None:
        if value is not None:
            check_range(value)
        return value

    @model_validator(mode="after")
    def _kind_fields(self) -> Package:
        need = {"npm": ("name", "bin", "node"), "python": ("name", "module"), "none": ()}[self.kind]
        for key in need:
            if getattr(self, key) is None:
                raise ValueError(f"a {self.kind} package needs {key}")
        return self


TASK_ARGV_MAX = 100 << 10  # bytes of task text a preset with task_in_argv takes


class Run(_Strict):
    command: str | None = Field(
        None, min_length=1, description="bash, run in the workdir; None: the instance's own ``command``"
    )
    task_in_argv: bool = Field(
        False,
        description="the command passes the task's text as "
        'one argument (``-p "$(cat "$ROLLSERVE_TASK_FILE")"``): '
        "Linux refuses an argument over 128 KiB, so a task over "
        "TASK_ARGV_MAX bytes is refused at submit",
    )


class PromptSize(_Strict):
    """``[prompt]``: how many tokens the harness's first request takes (its system
    prompt, tool schemas and a one-line task, rendered by the policy's chat template),
    measured by running it (``scripts/harness_first_prompt.py``). At submit a rollout
    whose context window cannot hold ``first_tokens`` and a margin is refused (a 422
    naming ``instance.harness.preset`` and both numbers) instead of failing at its
    first call."""

    first_tokens: int = Field(
        ge=1,
        description="the count submit checks: the fewest of "
        "``measured`` (a window refused is too small for any of them)",
    )
    measured: dict[str, int] = Field(default_factory=dict, description="tokenizer (name, version) -> the count with it")
    harness_version: str | None = Field(None, description="the harness's version measured")

    @model_validator(mode="after")
    def _fewest(self) -> PromptSize:
        if self.measured and self.first_tokens > min(self.measured.values()):
            raise ValueError(
                f"first_tokens {self.first_tokens} is more than the fewest "
                f"measured ({min(self.measured.values())}): a window that holds "
                "that tokenizer's count would be refused"
            )
        return self


class Calls(_Strict):
    """``[calls]``: the harness's auxiliary calls (titles, a small fast model,
    compaction...), told apart from its main loop by the model name they ask for. With
    this table the runner opens the session with ``contract.calls.GatewayCalls``
    (``main_model`` the name the harness's main loop asks for, ``$ROLLSERVE_MODEL``):
    a call asking for a model this table names is recorded apart, in
    ``trajectory.auxiliary``, with this table's purpose; a call asking for any other
    model is the main loop's (so what leaves the main loop is never the agent's
    choice). Without the table every call is the main loop's."""

    auxiliary: dict[str, str] = Field(
        default_factory=dict, description="model name the harness asks for -> purpose (lower_snake_case)"
    )

    @field_validator("auxiliary")
    @classmethod
    def _as_the_gateway_takes_it(cls, auxiliary: dict[str, str]) -> dict[str, str]:
        # The session the runner opens, built here: its checks are the only ones.
        try:
            GatewayCalls(main_model=POLICY_MODEL, auxiliary=auxiliary)
        except ValidationError as error:
            raise ValueError(error.errors()[0]["msg"].removeprefix("Value error, ")) from None
        return auxiliary

    def gateway_calls(self) -> GatewayCalls:
        """The session's ``GatewayCalls``: the main loop asks for ``POLICY_MODEL``."""
        return GatewayCalls(main_model=POLICY_MODEL, auxiliary=dict(self.auxiliary))


class Option(_Strict):
    """A per-instance setting (``instance.harness.<key>``), exposed as
    ``$ROLLSERVE_OPT_<KEY>``."""

    type: Literal["string", "list"] = "string"
    default: str | list[str] | None = None
    pattern: str | None = None
    min_items: int = Field(0, ge=0)
    description: str = ""

    @model_validator(mode="after")
    def _default_fits(self) -> Option:
        if self.default is not None and isinstance(self.default, list) != (self.type == "list"):
            raise ValueError(f"default does not fit type {self.type!r}")
        if self.pattern is not None:
            re.compile(self.pattern)
        return self


class Preset(_Strict):
    name: str = Field(pattern=NAME)
    summary: str = Field(min_length=1)
    wire: Literal["openai-chat", "openai-responses", "anthropic"]
    tool_calls: Literal["hermes", "none"] = "hermes"
    package: Package
    run: Run = Field(default_factory=Run)
    env: dict[str, str] = Field(default_factory=dict)
    files: dict[str, str] = Field(
        default_factory=dict, description="path under $HOME -> text; ${VAR} expands from the run's environment"
    )
    options: dict[str, Option] = Field(default_factory=dict)
    calls: Calls | None = Field(None, description="[calls]: its auxiliary calls (see Calls)")
    prompt: PromptSize | None = Field(None, description="[prompt]: its first prompt's size (see PromptSize)")

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        for key in env:
            if not ENV_NAME.match(key):
                raise ValueError(f"{key!r} is not an environment variable name")
            if key in RESERVED_ENV:
                raise ValueError(f"{key} is set by the runner; a preset may not set it")
        return env

    @field_validator("files")
    @classmethod
    def _relative_paths(cls, files: dict[str, str]) -> dict[str, str]:
        for path in files:
            parts = path.split("/")
            if not path or path.startswith("/") or any(p in ("", ".", "..") for p in parts):
                raise ValueError(f"{path!r}: a path relative to $HOME, without '..'")
        return files

    @field_validator("options")
    @classmethod
    def _option_names(cls, options: dict[str, Option]) -> dict[str, Option]:
        for key in options:
            if not re.match(r"^[a-z][a-z0-9_]{0,39}$", key) or key in ("preset", "command", "tool_calls"):
                raise ValueError(f"{key!r}: an option is a lower-case name, not preset, command or tool_calls")
        return options

    @model_validator(mode="after")
    def _argv_declared(self) -> Preset:
        if (
            self.run.command is not None
            and '$(cat "$ROLLSERVE_TASK_FILE")' in self.run.command
            and not self.run.task_in_argv
        ):
            raise ValueError(
                "run: the command passes the task file's text as an argument: "
                "declare task_in_argv = true (a task over TASK_ARGV_MAX bytes "
                "is then refused at submit)"
            )
        return self

    @property
    def takes_command(self) -> bool:
        """Whether the instance gives the command (the preset has none)."""
        return self.run.command is None


def load_preset(path: Path) -> Preset:
    """One preset file; ``PresetFileError`` naming the file and key if it is not one."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise PresetFileError(path, "(file)", str(error)) from None
    except tomllib.TOMLDecodeError as error:
        raise PresetFileError(path, "(syntax)", str(error)) from None
    try:
        preset = Preset.model_validate(data)
    except ValidationError as error:
        # A misspelt key first: the "missing" error of its right spelling follows from it.
        first = sorted(error.errors(), key=lambda e: e["type"] != "extra_forbidden")[0]
        key = ".".join(str(p) for p in first["loc"]) or "(top)"
        raise PresetFileError(path, key, first["msg"]) from None
    if preset.name != path.stem:
        raise PresetFileError(path, "name", f"{preset.name!r} is not the file's name {path.stem!r}")
    return preset


def presets(folder: Path = PRESETS_DIR) -> dict[str, Preset]:
    """Every ``*.toml`` preset in ``folder``, by name; the first bad file raises. A
    file is read again once it changed (its size or time)."""
    found = {}
    for path in sorted(folder.resolve().glob("*.toml")):
        stat = path.stat()
        found[path.stem] = _read(path, stat.st_mtime_ns, stat.st_size)
    return found


@functools.lru_cache(maxsize=256)
def _read(path: Path, _mtime: int, _size: int) -> Preset:
    return load_preset(path)
