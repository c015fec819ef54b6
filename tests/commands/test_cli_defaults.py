"""Every command-line option that sets a config model's field takes its default from that
model: equal to it today, and following it when the model's default changes (a literal
typed into the option again would stay behind, and the second test says which).

The table below says, per command, which model field each option sets; an option named
after a field of the command's models must be in it, or in NOT_MIRRORED with the reason.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pydantic
from pydantic import BaseModel
from typer.core import TyperCommand, TyperGroup

import rollserve
from rollserve.api.prorl import ProRLConfig
from rollserve.client.run_dataset import RunOptions
from rollserve.commands.quickstart import QuickstartOptions
from rollserve.engine.pipeline import EngineConfig
from rollserve.engine.requests import MIB, RequestLimits
from rollserve.llm.routing.router import RouterConfig
from rollserve.llm.tokens.tokenizer import DEFAULT_TOKENIZER
from rollserve.server import ServerConfig
from tests.source_ast import parse_source

# (Nothing here imports rollserve.cli at module level: the shifted run below imports
# this module first, changes the models, and only then the command line.)

ROOT = Path(__file__).resolve().parents[2]
Model = type  # a pydantic model or a dataclass


@dataclass(frozen=True)
class Mirror:
    """An option that sets ``model.field``; its value is the field's divided by ``unit``."""

    model: Model
    field: str
    shifted: object  # another default the model could have (of the field's type)
    unit: float = 1.0

    def option_value(self, value: object) -> object:
        if self.unit == 1.0 or value is None:
            return value
        assert isinstance(value, (int, float))
        return value / self.unit


_SERVER_SIDE: dict[str, Mirror] = {  # `serve`'s options that `run` repeats for its own server
    "backend": Mirror(ServerConfig, "backends", ["embedded"]),
    "tokenizer": Mirror(ServerConfig, "tokenizer", "/models/another-tokenizer"),
    "sandbox_runtime": Mirror(ServerConfig, "sandbox_runtime", "apptainer"),
    "scoring_workers": Mirror(ServerConfig, "scoring_workers", 5),
    "init_workers": Mirror(EngineConfig, "init_workers", 3),
    "run_workers": Mirror(EngineConfig, "run_workers", 7),
    "eval_workers": Mirror(EngineConfig, "eval_workers", 9),
}

MIRRORS: dict[str, dict[str, Mirror]] = {
    "serve": {
        **_SERVER_SIDE,
        "host": Mirror(ServerConfig, "host", "0.0.0.0"),
        "state_dir": Mirror(ServerConfig, "state_dir", Path("/elsewhere/state")),
        "store": Mirror(ServerConfig, "store_path", Path("/elsewhere/rollserve.db")),
        "api_token": Mirror(ServerConfig, "api_token", "a-token"),
        "public_docs": Mirror(ServerConfig, "public_docs", True),
        "public_seeds": Mirror(ServerConfig, "public_seeds", True),
        "routing": Mirror(RouterConfig, "policy", "round_robin"),
        "forward_pause": Mirror(RouterConfig, "forward_pause", True),
        "max_pending": Mirror(EngineConfig, "max_pending", 77),
        "on_restart": Mirror(EngineConfig, "on_restart", "interrupt"),
        "retention_hours": Mirror(EngineConfig, "retention_s", 7200.0, unit=3600.0),
        "max_staleness": Mirror(EngineConfig, "max_staleness", 3),
        "mask_stale": Mirror(EngineConfig, "mask_stale", True),
        "max_request_mb": Mirror(RequestLimits, "max_request_bytes", 8 * MIB, unit=MIB),
        "max_instance_mb": Mirror(RequestLimits, "max_instance_bytes", 2 * MIB, unit=MIB),
        "prorl_timeout": Mirror(ProRLConfig, "timeout", 600.0),
        "sandbox_pool": Mirror(ServerConfig, "sandbox_pool", 12),
        "gc_freeze": Mirror(ServerConfig, "gc_freeze", False),
        "gc_gen0": Mirror(ServerConfig, "gc_gen0", 20_000),
        "rollout_slice_ms": Mirror(ServerConfig, "rollout_slice_ms", 2.5),
    },
    "run": {
        **_SERVER_SIDE,
        "batch_size": Mirror(RunOptions, "batch_size", 8),
        "concurrency": Mirror(RunOptions, "max_in_flight", 24),
    },
    "quickstart": {
        "easy_tasks": Mirror(QuickstartOptions, "easy_tasks", 5),
        "tasks": Mirror(QuickstartOptions, "tasks", 3),
        "code_tasks": Mirror(QuickstartOptions, "code_tasks", 1),
        "n": Mirror(QuickstartOptions, "n", 4),
        "max_tokens": Mirror(QuickstartOptions, "max_tokens", 80),
        "max_turns": Mirror(QuickstartOptions, "max_turns", 3),
        "temperature": Mirror(QuickstartOptions, "temperature", 1.0),
        "out": Mirror(QuickstartOptions, "out", Path("elsewhere.jsonl")),
        "state_dir": Mirror(QuickstartOptions, "state_dir", Path("/elsewhere/quickstart")),
        "port": Mirror(QuickstartOptions, "port", 8123),
        "seed": Mirror(QuickstartOptions, "seed", 11),
        "backend": Mirror(QuickstartOptions, "backend", "http://elsewhere:8000"),
        "keep_serving": Mirror(QuickstartOptions, "keep_serving", True),
    },
}

# The models each command's options fill: an option named after one of their fields is
# taken to set it, unless listed here with why it does not mirror the field's default.
MODELS: dict[str, tuple[Model, ...]] = {
    "serve": (ServerConfig, EngineConfig, RouterConfig, RequestLimits, ProRLConfig),
    "run": (ServerConfig, EngineConfig, RunOptions),
    "quickstart": (QuickstartOptions,),
}
NOT_MIRRORED: dict[tuple[str, str], str] = {
    ("serve", "port"): "None: ServerConfig's port, or ProRL's with --prorl (the help says both)",
    ("serve", "sandbox_options"): "JSON text, parsed into the field",
    ("serve", "handler_options"): "JSON text, parsed into the field",
    ("serve", "harness_dir"): "None: $ROLLSERVE_HARNESS_DIR, else the default root, resolved "
    "once by agent.harnesses.install.install_root",
    ("serve", "default_judge"): "None: no rubric applies to a task that names none",
    ("serve", "ray"): "the cluster's address: with --ray-resource it makes the field's RayConfig",
    ("run", "sandbox_options"): "JSON text, parsed into the field",
    ("run", "handler_options"): "JSON text, parsed into the field",
    ("run", "sampling"): "JSON text; None: nothing sent, the server's defaults apply",
    ("run", "state_dir"): "None: a temporary folder, removed after the run",
    ("run", "api_token"): "the token of --server, not the embedded server's",
}


def _fields(model: Model) -> dict[str, object]:
    """Each field's default, as an instance made with no arguments has it."""
    if isinstance(model, type) and issubclass(model, BaseModel):
        made = model()
        return {name: getattr(made, name) for name in type(made).model_fields}
    assert dataclasses.is_dataclass(model)
    made = model()
    return {f.name: getattr(made, f.name) for f in dataclasses.fields(made)}


def _commands(command: TyperGroup | TyperCommand, path: str = "") -> Iterator[tuple[str, TyperCommand]]:
    if isinstance(command, TyperGroup):
        for name, sub in command.commands.items():
            yield from _commands(sub, f"{path} {name}".strip())
    else:
        yield path, command


def cli_defaults() -> dict[str, dict[str, object]]:
    """Every command's options and their defaults, read from the typer app."""
    import typer.main

    from rollserve.cli import app

    return {
        path: {param.name: param.default for param in command.params if param.name}
        for path, command in _commands(typer.main.get_command(app))
    }


def test_every_mirrored_option_defaults_to_its_models_default() -> None:
    defaults = cli_defaults()
    wrong = []
    for command, mirrors in MIRRORS.items():
        for option, mirror in mirrors.items():
            assert option in defaults[command], f"{command} has no option {option} any more"
            expected = mirror.option_value(_fields(mirror.model)[mirror.field])
            if defaults[command][option] != expected:
                wrong.append(
                    f"{command} --{option}: {defaults[command][option]!r}, but "
                    f"{mirror.model.__name__}.{mirror.field} says {expected!r}"
                )
    assert not wrong, "\n".join(wrong)


def test_every_option_named_after_a_field_is_in_the_table() -> None:
    defaults = cli_defaults()
    missing = []
    for command, models in MODELS.items():
        fields = {name for model in models for name in _fields(model)}
        for option in defaults[command]:
            if option in fields and option not in MIRRORS[command] and (command, option) not in NOT_MIRRORED:
                missing.append(f"{command} --{option}")
    assert not missing, f"options that set a model's field but are not checked: {missing}"


def test_every_tokenizer_option_defaults_to_the_one_default_tokenizer() -> None:
    tokenizers = {
        command: options["tokenizer"] for command, options in cli_defaults().items() if "tokenizer" in options
    }
    assert {"serve", "run", "fake-llm"} <= set(tokenizers)
    assert set(tokenizers.values()) == {DEFAULT_TOKENIZER}, tokenizers


def test_the_default_tokenizer_is_named_once_in_the_source() -> None:
    """``"smollm2"`` is written once, as DEFAULT_TOKENIZER; everything else uses the name."""
    found = []
    for path in sorted(Path(rollserve.__file__).parent.rglob("*.py")):
        for node in ast.walk(parse_source(path)):
            if isinstance(node, ast.Constant) and node.value == DEFAULT_TOKENIZER:
                found.append(f"{path.relative_to(ROOT / 'src')}:{node.lineno}")
    assert len(found) == 1 and found[0].startswith("rollserve/llm/tokens/tokenizer.py:"), found


# --- the same options with every model's defaults changed ------------------------------------
def _shifted(model: Model, values: dict[str, object]) -> Model:
    """A subclass of ``model`` whose defaults for ``values``' fields are those values."""
    if isinstance(model, type) and issubclass(model, BaseModel):
        fields: dict[str, tuple[object, object]] = {
            name: (model.model_fields[name].annotation, value) for name, value in values.items()
        }
        return pydantic.create_model(model.__name__, __base__=model, **fields)  # type: ignore[call-overload]
    return dataclasses.make_dataclass(
        model.__name__,
        [(name, object, dataclasses.field(default=value)) for name, value in values.items()],
        bases=(model,),
    )


def _encode(value: object) -> object:
    return str(value) if isinstance(value, Path) else value


def shifted_run() -> None:
    """In a fresh interpreter: every model in the table gets the ``shifted`` defaults, in
    every module that holds it, before rollserve.cli is imported; prints the command
    line's defaults then (as JSON)."""
    by_model: dict[Model, dict[str, object]] = {}
    for mirrors in MIRRORS.values():
        for mirror in mirrors.values():
            by_model.setdefault(mirror.model, {})[mirror.field] = mirror.shifted
    assert "rollserve.cli" not in sys.modules and "rollserve.commands.defaults" not in sys.modules
    for model, values in by_model.items():
        replacement = _shifted(model, values)
        for module in list(sys.modules.values()):
            for name, held in list(vars(module).items()):
                if held is model:
                    setattr(module, name, replacement)
    print(
        json.dumps(
            {
                command: {name: _encode(value) for name, value in options.items()}
                for command, options in cli_defaults().items()
            }
        )
    )


def test_options_follow_their_models_defaults_when_those_change() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", "import tests.commands.test_cli_defaults as t; t.shifted_run()"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    defaults = json.loads(done.stdout.strip().splitlines()[-1])
    stale = []
    for command, mirrors in MIRRORS.items():
        for option, mirror in mirrors.items():
            expected = _encode(mirror.option_value(mirror.shifted))
            if defaults[command][option] != expected:
                stale.append(
                    f"{command} --{option} stayed {defaults[command][option]!r} when "
                    f"{mirror.model.__name__}.{mirror.field} became {mirror.shifted!r}"
                )
    assert not stale, "options with a default of their own (a literal?):\n" + "\n".join(stale)
