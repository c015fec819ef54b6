"""Options several commands share (``serve``, ``run``'s embedded server, ``datasets
validate``, ``images pull``), parsed and checked one way: a bad value is a typer
``BadParameter`` naming the option (exit 2) before anything starts."""

from __future__ import annotations

import json
from typing import Any

import typer
from pydantic import ValidationError

from rollserve.contract.judge import Rubric


def parse_json_option(value: str | None, name: str) -> dict[str, Any]:
    """A JSON object option (``{}`` when not given)."""
    if not value:
        return {}
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise typer.BadParameter(f"not valid JSON: {exc}", param_hint=name) from None
    if not isinstance(parsed, dict):
        raise typer.BadParameter("must be a JSON object", param_hint=name)
    return parsed


def check_backends(specs: list[str]) -> None:
    from rollserve.llm.backends import parse_backend_spec

    for spec in specs:
        try:
            parse_backend_spec(spec)
        except ValueError as exc:
            raise typer.BadParameter(f"{exc} (e.g. http://gpu-node:8000 or embedded)", param_hint="--backend") from exc


def check_runtime(name: str, hint: str = "--sandbox-runtime") -> None:
    from rollserve.sandbox.registry import RUNTIMES

    if name not in RUNTIMES:
        raise typer.BadParameter(f"unknown runtime {name!r}; known: {', '.join(RUNTIMES)}", param_hint=hint)


def sandbox_options(runtime: str, value: str | None) -> dict[str, Any]:
    """``--sandbox-options``: the runtime's config as JSON, checked against its model
    (``sandbox.config.runtime_config``: the bad option named, with the known ones)."""
    from rollserve.sandbox.config import runtime_config

    check_runtime(runtime)
    options = parse_json_option(value, "--sandbox-options")
    try:
        runtime_config(runtime, options)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--sandbox-options") from exc
    return options


def handler_options(value: str | None) -> dict[str, dict[str, Any]]:
    """``--handler-options``: each handler's settings, ``{"swe": {...}}``."""
    options = parse_json_option(value, "--handler-options")
    if not all(isinstance(v, dict) for v in options.values()):
        raise typer.BadParameter(
            'must be a JSON object of objects, e.g. {"swe": {"empty_patch": "run"}}', param_hint="--handler-options"
        )
    return options


def check_judges(specs: list[str]) -> None:
    """Each ``--judge`` describes a judge with a backend (a clear error naming it)."""
    from rollserve.llm.backends import parse_backend_spec
    from rollserve.llm.judges import check_unique, parse_judge_spec

    names: list[str] = []
    for spec in specs:
        try:
            config = parse_judge_spec(spec)
            parse_backend_spec(config.backend)
        except ValueError as exc:  # (a BackendSpecError is one)
            raise typer.BadParameter(f"{spec!r}: {exc}", param_hint="--judge") from exc
        names.append(config.name)
    try:
        check_unique(names)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--judge") from None


def parse_rubrics(specs: list[str]) -> dict[str, Rubric]:
    """``--rubric NAME=JSON`` (or ``NAME=@file.json``) as named rubrics."""
    from pathlib import Path

    rubrics: dict[str, Rubric] = {}
    for spec in specs:
        name, sep, body = spec.partition("=")
        if not sep or not name or not body:
            raise typer.BadParameter(f"{spec!r}: expected NAME=JSON", param_hint="--rubric")
        try:
            text = Path(body[1:]).read_text(encoding="utf-8") if body.startswith("@") else body
            rubrics[name] = Rubric.model_validate_json(text)
        except (OSError, ValidationError) as exc:
            raise typer.BadParameter(f"{name}: {exc}", param_hint="--rubric") from exc
    return rubrics
