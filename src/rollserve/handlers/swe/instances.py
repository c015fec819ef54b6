"""SWE instances: the SWE-bench schema, its SWE-Gym variant and R2E-Gym's, detected
from the fields present and normalised to one ``SWETask``.

- **SWE-bench** (and SWE-bench Verified/Lite, ``swe-mini``): ``instance_id``, ``repo``,
  ``base_commit``, ``problem_statement``, ``test_patch``, ``FAIL_TO_PASS``,
  ``PASS_TO_PASS`` (JSON-encoded lists in the HF dataset, or lists), ``version``,
  ``environment_setup_commit``; optionally ``patch`` (gold), and, in swebench>=5
  datasets, ``image``, ``eval_script``, ``log_parser``, ``eval_type``.
- **SWE-Gym**: the same fields, but the test lists are lists and there is no
  ``environment_setup_commit``; its images live under another namespace.
- **R2E-Gym**: ``repo_name``, ``docker_image``, ``problem_statement`` and
  ``expected_output_json`` (test -> expected status, as JSON); the tests ship inside
  the image (``/r2e_tests``, run by ``run_tests.sh``).

An explicit ``"schema": "swe-bench" | "swe-gym" | "r2e-gym"`` overrides detection.
Rollserve's own optional fields, for any schema: ``test_cmd`` (the test command,
else one is derived), ``log_parser`` (a swebench parser name), ``image``,
``test_timeout`` (seconds for this instance's test run, at most the server's
``test_timeout``; SWE-bench's harness has one run-wide ``--timeout`` and SWE-smith a
``timeout`` per repository profile, none of them in the instances).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rollserve.handlers.base import InvalidInstance

SCHEMAS: tuple[str, ...] = ("swe-bench", "swe-gym", "r2e-gym")

SWE_BENCH_REQUIRED = (
    "instance_id",
    "repo",
    "base_commit",
    "problem_statement",
    "test_patch",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
)
R2E_REQUIRED = ("docker_image", "problem_statement", "expected_output_json")
_SHA = re.compile(r"^[0-9a-f]{7,40}$")
_REPO = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
_DIFF_FILE = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)


@dataclass
class SWETask:
    schema: str
    instance_id: str
    repo: str
    problem_statement: str
    base_commit: str | None = None
    test_patch: str | None = None
    fail_to_pass: list[str] = field(default_factory=list)
    pass_to_pass: list[str] = field(default_factory=list)
    version: str = ""
    image: str | None = None  # an explicit environment image (docker reference)
    eval_script: str | None = None  # swebench>=5 datasets carry their own
    log_parser: str | None = None
    eval_type: str = "pass_and_fail"
    test_cmd: str | None = None
    expected: dict[str, str] | None = None  # R2E-Gym: test -> expected status
    test_timeout: float | None = None  # seconds for the test run (else the server's)

    @property
    def test_files(self) -> list[str]:
        """The files the test patch touches (reset to base before it is applied)."""
        return patch_files(self.test_patch or "")


def patch_files(diff: str) -> list[str]:
    """Paths a ``git diff`` touches (both sides of renames), in order, once each."""
    seen: dict[str, None] = {}
    for old, new in _DIFF_FILE.findall(diff):
        seen.setdefault(old)
        seen.setdefault(new)
    return list(seen)


def detect_schema(instance: Mapping[str, Any]) -> str:
    """Which schema ``instance`` is in; InvalidInstance naming what is missing."""
    if not isinstance(instance, dict):
        raise InvalidInstance("instance", "must be an object")
    explicit = instance.get("schema")
    if explicit is not None:
        if explicit not in SCHEMAS:
            raise InvalidInstance("instance.schema", f"must be one of {', '.join(SCHEMAS)}, got {explicit!r}")
        return explicit
    if "docker_image" in instance and ("expected_output_json" in instance or "parsed_commit_content" in instance):
        return "r2e-gym"
    if "instance_id" in instance and "base_commit" in instance:
        lists = isinstance(instance.get("FAIL_TO_PASS"), list)
        if lists and "environment_setup_commit" not in instance:
            return "swe-gym"
        return "swe-bench"
    raise InvalidInstance(
        "instance",
        "not a SWE-bench, SWE-Gym or R2E-Gym instance: SWE-bench/SWE-Gym need "
        f"{', '.join(SWE_BENCH_REQUIRED)}; R2E-Gym needs {', '.join(R2E_REQUIRED)} "
        "(or set 'schema')",
    )


def parse_task(instance: Mapping[str, Any]) -> SWETask:
    """The instance as a ``SWETask``; InvalidInstance naming the first bad field."""
    schema = detect_schema(instance)
    if schema == "r2e-gym":
        task = _r2e(instance)
    else:
        task = _swe_bench(instance, schema)
    for key in ("test_cmd", "log_parser", "image", "eval_script"):
        if key in instance and instance[key] is not None:
            value = _string(instance, key)
            setattr(task, key, value)
    if task.log_parser is not None:
        _check_parser(task.log_parser)
    if instance.get("test_timeout") is not None:
        task.test_timeout = _seconds(instance, "test_timeout")
    return task


def _swe_bench(instance: Mapping[str, Any], schema: str) -> SWETask:
    for key in SWE_BENCH_REQUIRED:
        if key not in instance:
            raise InvalidInstance(f"instance.{key}", f"required for a {schema} instance")
    repo = _string(instance, "repo")
    if not _REPO.match(repo):
        raise InvalidInstance("instance.repo", f"must be 'owner/name', got {repo!r}")
    base = _string(instance, "base_commit")
    if not _SHA.match(base):
        raise InvalidInstance("instance.base_commit", "must be a git commit hash (hex)")
    test_patch = _string(instance, "test_patch")
    if not patch_files(test_patch):
        raise InvalidInstance("instance.test_patch", "must be a git diff (no 'diff --git' header found)")
    if instance.get("patch") is not None and not isinstance(instance["patch"], str):
        raise InvalidInstance("instance.patch", "must be a string (a git diff)")
    f2p = _test_list(instance, "FAIL_TO_PASS")
    if not f2p and instance.get("eval_type", "pass_and_fail") != "fail_only":
        raise InvalidInstance("instance.FAIL_TO_PASS", "must name at least one test")
    eval_type = instance.get("eval_type") or "pass_and_fail"
    if eval_type not in ("pass_and_fail", "fail_only"):
        raise InvalidInstance("instance.eval_type", "must be 'pass_and_fail' or 'fail_only'")
    return SWETask(
        schema=schema,
        instance_id=_string(instance, "instance_id"),
        repo=repo,
        problem_statement=_string(instance, "problem_statement"),
        base_commit=base,
        test_patch=test_patch,
        fail_to_pass=f2p,
        pass_to_pass=_test_list(instance, "PASS_TO_PASS"),
        version=str(instance.get("version", "")),
        eval_type=eval_type,
    )


def _r2e(instance: Mapping[str, Any]) -> SWETask:
    for key in R2E_REQUIRED:
        if key not in instance:
            raise InvalidInstance(f"instance.{key}", "required for an R2E-Gym instance")
    raw = instance["expected_output_json"]
    try:
        expected = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError as exc:
        raise InvalidInstance("instance.expected_output_json", f"not JSON: {exc.msg}") from None
    if (
        not isinstance(expected, dict)
        or not expected
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in expected.items())
    ):
        raise InvalidInstance(
            "instance.expected_output_json", "must map each test to its expected status (PASSED, FAILED, ...)"
        )
    image = _string(instance, "docker_image")
    repo = instance.get("repo_name") or instance.get("repo") or image.split("/")[-1].split(":")[0]
    commit = None
    content = instance.get("parsed_commit_content")
    if isinstance(content, str):
        try:
            content = json.loads(content)
        except json.JSONDecodeError:
            content = None
    if isinstance(content, dict) and isinstance(content.get("old_commit_hash"), str):
        commit = content["old_commit_hash"]
    instance_id = instance.get("instance_id") or f"{repo}@{image.rsplit(':', 1)[-1][:12]}"
    return SWETask(
        schema="r2e-gym",
        instance_id=str(instance_id),
        repo=str(repo),
        problem_statement=_string(instance, "problem_statement"),
        base_commit=commit,
        image=image,
        expected={k: v.upper() for k, v in expected.items()},
        log_parser="parse_log_pytest",
    )


def _string(instance: Mapping[str, Any], key: str) -> str:
    value = instance.get(key)
    if not isinstance(value, str) or not value.strip():
        raise InvalidInstance(f"instance.{key}", "must be a non-empty string")
    return value


def _seconds(instance: Mapping[str, Any], key: str) -> float:
    value = instance[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise InvalidInstance(f"instance.{key}", f"must be a number of seconds above 0, got {value!r}")
    return float(value)


def _test_list(instance: Mapping[str, Any], key: str) -> list[str]:
    raw = instance[key]
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError:
            raise InvalidInstance(
                f"instance.{key}", "must be a list of test names (or that list JSON-encoded)"
            ) from None
    if not isinstance(raw, list) or not all(isinstance(t, str) and t for t in raw):
        raise InvalidInstance(f"instance.{key}", "must be a list of test names")
    return raw


def _check_parser(name: str) -> None:
    try:
        from swebench.harness.log_parsers import PARSER_REGISTRY
    except ImportError:
        return  # reported when the handler is built (SWEHandler needs swebench)
    if name not in PARSER_REGISTRY:
        known = ", ".join(sorted(k for k in PARSER_REGISTRY if "pytest" in k or "django" in k))
        raise InvalidInstance("instance.log_parser", f"unknown swebench log parser {name!r} (e.g. {known})")
