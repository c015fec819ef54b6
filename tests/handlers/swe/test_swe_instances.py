"""SWE instances: schema detection (SWE-bench, SWE-Gym, R2E-Gym), errors naming the
field, image naming, test commands and grading of logs with swebench's parsers."""

from __future__ import annotations

import json

import pytest

from rollserve.errors import InfraError
from rollserve.handlers.base import HandlerContext, InvalidInstance
from rollserve.handlers.swe import SWEHandler
from rollserve.handlers.swe.canaries import Canary, Placement
from rollserve.handlers.swe.environment import SWEOptions, image_name, image_reference, use_images
from rollserve.handlers.swe.evaluate import eval_script, suite_command
from rollserve.handlers.swe.grade import END, START, grade, log_parser_name
from rollserve.handlers.swe.instances import parse_task, patch_files
from rollserve.handlers.swe.results import Results

TEST_PATCH = (
    "diff --git a/tests/test_x.py b/tests/test_x.py\n--- a/tests/test_x.py\n"
    "+++ b/tests/test_x.py\n@@ -1 +1,2 @@\n x = 1\n+y = 2\n"
)
SWE_BENCH = {
    "instance_id": "django__django-11099",
    "repo": "django/django",
    "base_commit": "d26b2424437dabeeca94d7900b37d2df4410da0c",
    "problem_statement": "UsernameValidator allows trailing newline",
    "test_patch": TEST_PATCH,
    "patch": "",
    "FAIL_TO_PASS": json.dumps(["test_a (auth_tests.test_validators.T)"]),
    "PASS_TO_PASS": json.dumps([]),
    "version": "3.0",
    "environment_setup_commit": "419a78300f7cd27611196e1e464d50fd0385ff27",
}
SWE_GYM = {k: v for k, v in SWE_BENCH.items() if k != "environment_setup_commit"}
SWE_GYM.update(
    instance_id="getmoto__moto-5752",
    repo="getmoto/moto",
    FAIL_TO_PASS=["tests/test_x.py::test_y"],
    PASS_TO_PASS=["tests/test_x.py::test_z"],
)
R2E = {
    "repo_name": "aiohttp",
    "docker_image": "namanjain12/aiohttp_final:f0d74880deec",
    "problem_statement": "ClientSession leaks",
    "expected_output_json": json.dumps(
        {"r2e_tests/test_1.py::test_ok": "PASSED", "r2e_tests/test_1.py::test_bug": "PASSED"}
    ),
    "parsed_commit_content": json.dumps({"old_commit_hash": "abc1234", "file_diffs": []}),
}


def test_schemas_are_detected_from_the_fields():
    assert parse_task(SWE_BENCH).schema == "swe-bench"
    gym = parse_task(SWE_GYM)
    assert gym.schema == "swe-gym" and gym.fail_to_pass == ["tests/test_x.py::test_y"]
    r2e = parse_task(R2E)
    assert r2e.schema == "r2e-gym" and r2e.base_commit == "abc1234" and r2e.repo == "aiohttp"
    assert r2e.expected["r2e_tests/test_1.py::test_bug"] == "PASSED"
    assert parse_task({**SWE_GYM, "schema": "swe-bench"}).schema == "swe-bench"
    assert patch_files(TEST_PATCH) == ["tests/test_x.py"]


@pytest.mark.parametrize(
    "instance, field",
    [
        ({"question": "2+2?"}, "instance"),
        ({**SWE_BENCH, "schema": "swe-lite"}, "instance.schema"),
        ({k: v for k, v in SWE_BENCH.items() if k != "test_patch"}, "instance.test_patch"),
        ({**SWE_BENCH, "repo": "django"}, "instance.repo"),
        ({**SWE_BENCH, "base_commit": "main"}, "instance.base_commit"),
        ({**SWE_BENCH, "test_patch": "not a diff"}, "instance.test_patch"),
        ({**SWE_BENCH, "FAIL_TO_PASS": "[not json"}, "instance.FAIL_TO_PASS"),
        ({**SWE_BENCH, "FAIL_TO_PASS": "[]"}, "instance.FAIL_TO_PASS"),
        ({**SWE_BENCH, "PASS_TO_PASS": [1, 2]}, "instance.PASS_TO_PASS"),
        ({**SWE_BENCH, "problem_statement": ""}, "instance.problem_statement"),
        ({**SWE_BENCH, "log_parser": "parse_log_cobol"}, "instance.log_parser"),
        ({**SWE_BENCH, "eval_type": "vibes"}, "instance.eval_type"),
        ({**R2E, "expected_output_json": "{}"}, "instance.expected_output_json"),
        ({**R2E, "expected_output_json": "{bad"}, "instance.expected_output_json"),
    ],
)
def test_bad_instances_name_the_field(instance, field):
    with pytest.raises(InvalidInstance) as caught:
        parse_task(instance)
    assert caught.value.field == field, caught.value


def test_image_names_follow_each_dataset():
    options = SWEOptions()
    assert image_name(parse_task(SWE_BENCH), options) == "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"
    assert image_name(parse_task(SWE_GYM), options) == "xingyaoww/sweb.eval.x86_64.getmoto_s_moto-5752:latest"
    assert image_name(parse_task(R2E), options) == "namanjain12/aiohttp_final:f0d74880deec"
    mine = SWEOptions(image_prefix="registry.local/swe/sweb.eval.x86_64.", image_tag="v2")
    assert image_name(parse_task(SWE_BENCH), mine) == "registry.local/swe/sweb.eval.x86_64.django_1776_django-11099:v2"
    assert image_name(parse_task({**SWE_BENCH, "image": "my/img:1"}), options) == "my/img:1"
    task = parse_task(SWE_BENCH)
    assert image_reference(task, options, "apptainer").startswith("docker://swebench/")
    assert image_reference(task, options, "singularity").startswith("docker://")
    assert image_reference(task, options, "podman") == image_name(task, options)
    assert image_reference(parse_task({**SWE_BENCH, "image": "/sif/x.sif"}), options, "apptainer") == "/sif/x.sif"


def test_the_environment_follows_the_runtime(tokenizer):
    assert use_images(SWEOptions(), "apptainer") and use_images(SWEOptions(), "docker")
    assert not use_images(SWEOptions(), "bubblewrap")
    assert use_images(SWEOptions(environment="image"), "bubblewrap")
    ctx = HandlerContext(tokenizer=tokenizer, scoring=None, sandboxes=None)
    handler = SWEHandler(ctx)
    with pytest.raises(InvalidInstance, match="image runtime"):
        handler.validate(R2E)  # no image runtime: R2E's tests live in its image
    with pytest.raises(ValueError, match="swe handler options"):
        SWEHandler(HandlerContext(tokenizer=tokenizer, scoring=None, options={"swe": {"mirors": []}}))


def test_test_commands_and_parsers_by_repository():
    django = parse_task(
        {**SWE_BENCH, "test_patch": TEST_PATCH.replace("tests/test_x.py", "tests/auth_tests/test_validators.py")}
    )
    assert suite_command(django) == (
        "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 auth_tests.test_validators"
    )
    assert log_parser_name(django) == "parse_log_django"
    gym = parse_task(SWE_GYM)
    assert suite_command(gym) == "python -m pytest --no-header -rA --tb=no -p no:cacheprovider tests/test_x.py"
    assert log_parser_name(gym) == "parse_log_pytest"
    custom = parse_task({**SWE_GYM, "test_cmd": "tox -e py -- {files}"})
    assert suite_command(custom) == "tox -e py -- tests/test_x.py"


def test_eval_scripts_reset_test_files_then_apply_the_test_patch():
    script = eval_script(parse_task(SWE_GYM), "conda activate testbed")
    lines = script.splitlines()
    assert lines[:3] == ["#!/bin/bash", "set -uxo pipefail", "conda activate testbed"]
    reset = next(i for i, line in enumerate(lines) if "git checkout" in line)
    apply = next(i for i, line in enumerate(lines) if line.startswith("git apply"))
    start = lines.index(f"echo '{START}'")
    assert reset < apply < start and lines[start + 2] == "SWEBENCH_TEST_EXIT_CODE=$?"
    own = {**SWE_BENCH, "eval_script": "#!/bin/bash\ncd /testbed\n./run"}
    assert eval_script(parse_task(own), None) == own["eval_script"]
    r2e = eval_script(parse_task(R2E), None)
    assert "cp -r /r2e_tests r2e_tests" in r2e and "bash run_tests.sh" in r2e


def log_of(lines: list[str], code: int = 1) -> str:
    return "\n".join(["+ git apply", START, *lines, END, f">>>>> Test Exit Code: {code}"])


def test_grading_uses_swebench_rules():
    task = parse_task({**SWE_GYM, "PASS_TO_PASS": ["tests/test_x.py::test_z", "tests/test_x.py::test_w"]})
    resolved = grade(
        task,
        log_of(
            ["PASSED tests/test_x.py::test_y", "PASSED tests/test_x.py::test_z", "SKIPPED tests/test_x.py::test_w"],
            code=0,
        ),
    )
    assert resolved["resolved"] and resolved["f2p_passed"] == 1 and resolved["p2p_passed"] == 2
    broke = grade(task, log_of(["PASSED tests/test_x.py::test_y", "FAILED tests/test_x.py::test_z - boom"]))
    assert not broke["resolved"]
    assert {t["test"]: t["ok"] for t in broke["tests"]}["tests/test_x.py::test_z"] is False
    missing = grade(task, log_of(["PASSED tests/test_x.py::test_z"]))
    assert not missing["resolved"]  # an F2P test that did not run is not a pass
    nothing = grade(task, "ERROR: file not found: tests/test_x.py")
    assert not nothing["resolved"] and not nothing["tests_ran"]


def test_r2e_grading_compares_with_the_expected_statuses():
    task = parse_task(R2E)
    ok = grade(task, log_of(["PASSED r2e_tests/test_1.py::test_ok", "PASSED r2e_tests/test_1.py::test_bug"]))
    assert ok["resolved"]
    bad = grade(task, log_of(["PASSED r2e_tests/test_1.py::test_ok", "FAILED r2e_tests/test_1.py::test_bug"]))
    assert not bad["resolved"] and [t["status"] for t in bad["tests"]] == ["FAILED", "PASSED"]


def test_an_environment_fault_in_the_log_is_infra_not_a_wrong_answer():
    task = parse_task(SWE_GYM)
    with pytest.raises(InfraError, match="out_of_memory"):
        grade(task, "+ python -m pytest\nfatal: Cannot allocate memory\n")
    # A suite that ran and failed is the patch's doing: scored.
    assert grade(task, log_of(["FAILED tests/test_x.py::test_y - boom"]))["resolved"] is False


def test_a_pass_that_carries_an_error_is_a_failure():
    """A hook that turns failures into passes leaves the error on the report:
    pytest's summary then reads ``PASSED <test> - AssertionError``."""
    task = parse_task(SWE_GYM)
    forged = grade(
        task,
        log_of(
            ["PASSED tests/test_x.py::test_y - AssertionError: assert 3 == 2", "PASSED tests/test_x.py::test_z"], code=0
        ),
    )
    assert not forged["resolved"]
    assert {t["test"]: t["status"] for t in forged["tests"]}["tests/test_x.py::test_y"] == "FAILED"


def recorded(outcomes: dict[str, str]) -> Results:
    """What the plugin records for tests whose call phase had these outcomes."""
    made = Results(sessions=1)
    for nodeid, outcome in outcomes.items():
        made.reports += [
            {"nodeid": nodeid, "when": "setup", "outcome": "passed"},
            {"nodeid": nodeid, "when": "call", "outcome": outcome, "longrepr": outcome == "failed"},
            {"nodeid": nodeid, "when": "teardown", "outcome": "passed"},
        ]
    return made


def test_recorded_outcomes_are_graded_not_the_logs_lines():
    task = parse_task(SWE_GYM)
    canary = "tests/test_x.py::test_y_edge_cases"
    placement = Placement("tests/test_x.py", [Canary("test_y_edge_cases", None, "tests/test_x.py::test_y", 9)])
    outcomes = {"tests/test_x.py::test_y": "passed", "tests/test_x.py::test_z": "passed", canary: "failed"}
    summary = "\n======== 1 failed, 2 passed in 0.10s ========"
    honest = grade(task, log_of([], code=1) + summary, recorded(outcomes), placement)
    assert honest["resolved"] and honest["canary"] == "failed" and honest["results_from"] == "plugin"
    assert honest["canaries"] == [
        {
            "test": "test_y_edge_cases",
            "class": None,
            "line": 9,
            "made_from": "tests/test_x.py::test_y",
            "status": "failed",
            "checked": True,
        }
    ]
    # Lines printed into the log change nothing: the records say test_y failed.
    failing = {**outcomes, "tests/test_x.py::test_y": "failed"}
    printed = grade(
        task,
        log_of(["PASSED tests/test_x.py::test_y"], code=0) + "\n======== 2 failed, 1 passed in 0.10s ========",
        recorded(failing),
        placement,
    )
    assert not printed["resolved"] and "reason" not in printed
    assert printed["canary"].startswith("not checked")  # its test failed: it says nothing
    # Outcomes rewritten: the canary passed too.
    forged = grade(
        task,
        log_of([], code=0) + "\n======== 3 passed in 0.10s ========",
        recorded({**outcomes, canary: "passed"}),
        placement,
    )
    assert not forged["resolved"] and forged["canary"] == "passed" and "rewritten" in forged["reason"]
    # A canary left out of the run (deselected, or its record dropped) is no pass either.
    dropped = grade(
        task,
        log_of([], code=0) + "\n======== 2 passed in 0.10s ========",
        recorded({k: v for k, v in outcomes.items() if k != canary}),
        placement,
    )
    assert not dropped["resolved"] and dropped["canary"] == "missing"
    # A summary line that does not match the records (one was printed, or rewritten).
    mismatch = grade(task, log_of([], code=0) + "\n======== 3 passed in 0.10s ========", recorded(outcomes), placement)
    assert not mismatch["resolved"] and "disagree" in mismatch["reason"]
    # No records at all (the plugin's file removed): nothing passed.
    gone = grade(task, log_of(["PASSED tests/test_x.py::test_y"], code=0), Results(), placement)
    assert not gone["resolved"] and gone["reason"] == "the test run recorded no test outcomes"


def test_canaries_in_a_log_parsed_run_django():
    """Django's runner: the log is parsed; a canary method reported ok is a rewrite."""
    task = parse_task(SWE_BENCH)
    placement = Placement(
        "tests/auth_tests/test_validators.py", [Canary("test_a_b", "T", "test_a (auth_tests.test_validators.T)", 5)]
    )
    lines = ["test_a (auth_tests.test_validators.T) ... ok"]
    honest = grade(task, log_of(lines + ["test_a_b (auth_tests.test_validators.T) ... FAIL"], code=1), None, placement)
    assert honest["resolved"] and honest["canary"] == "failed", honest
    forged = grade(task, log_of(lines + ["test_a_b (auth_tests.test_validators.T) ... ok"], code=0), None, placement)
    assert not forged["resolved"] and forged["canary"] == "passed" and "rewritten" in forged["reason"]


def test_only_the_set_up_part_of_a_log_can_show_an_environment_fault():
    """Text the tests print (the patch's code) cannot buy a mask."""
    task = parse_task(SWE_GYM)
    printed = grade(task, "\n".join(["+ git apply", START, "Could not resolve host: pypi.org", "collected 0 items"]))
    assert not printed["resolved"] and not printed["tests_ran"]
    with pytest.raises(InfraError, match="network_unreachable"):
        grade(task, "conda: Could not resolve host: repo.anaconda.com\n" + START + "\n")
