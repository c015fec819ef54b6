"""Assert tests decided on the server: what is sent to the sandbox (probes, never the
expected values), how the verdict follows from reported values, what is flagged as
judged in the sandbox, the strict reading of reports, and the runner's encoding
(run here as a plain subprocess, no sandbox needed)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from rollserve.datasets import bundled_rows
from rollserve.handlers.code.asserts import Check, compile_assert
from rollserve.handlers.code.hidden_tests import ASSERT_RUNNER, HiddenTests, split_asserts
from rollserve.handlers.code.names import setup_names
from rollserve.handlers.code.values import MalformedReport, Probe, read_report


def values(*items) -> list[Probe]:
    return [Probe("value", item) for item in items]


def check(source: str, setup: str = "") -> Check:
    return compile_assert(source, setup_names(setup))


# --- what goes to the sandbox ---------------------------------------------------------------
def test_only_the_solution_side_is_probed_and_literals_stay_here():
    c = check("assert solve([3, 1], 'k') == [31337, 'expected', (2, 3), {'k': 1.5}]")
    assert c.probes == ["solve([3, 1], 'k')"] and not c.in_sandbox
    c = check("assert abs(area(2.0) - 12.566) < 1e-2 and math.isclose(area(1), math.pi, rel_tol=1e-3)", "import math")
    assert c.probes == ["area(2.0)", "area(1)"] and not c.in_sandbox
    c = check("assert sorted(f(x))[:2] == [10 ** 9 + 7] * 2 and len(f(y)) in {3, 4}")
    assert c.probes == ["f(x)", "f(y)"]
    c = check("assert isinstance(f(1), (int, float)) and type(g(2)) is list")
    assert c.probes == ["f(1)", "g(2)"] and not c.in_sandbox


def test_every_bundled_assert_keeps_its_expected_value_out_of_the_sandbox():
    rows = [row for row in bundled_rows("code") if "asserts" in row]
    assert len(rows) >= 5
    for row in rows:
        setup, asserts = split_asserts(row["asserts"])
        bound = setup_names(setup)
        for source in asserts:
            c = compile_assert(source, bound)
            assert len(c.probes) == 1 and not c.in_sandbox and c.references == [], source
            assert source.startswith(f"assert {c.probes[0]} ")  # the left side, nothing more


@pytest.mark.parametrize(
    "source, setup",
    [
        ("assert f(1) == g(2)", ""),
        ("assert check(f)", "def check(candidate):\n    return candidate(1) == 1"),
        ("assert ok", "ok = f(3) == 9"),
        ("assert len([x for x in f(3) if x]) == 2", ""),
        ("assert all(x > 0 for x in f(3))", ""),  # the iterable is the solution's: not unrolled
        ("assert all(f(i) for i in range(10 ** 6))", ""),  # past the unrolling bound
        ("assert all(f(i) == g(i) for i in range(3))", ""),
        ("assert isinstance(f(3), int) == True", "from numpy import *"),  # a star import may bind anything
    ],
)
def test_verdicts_judged_in_the_sandbox_are_unsafe(source, setup):
    c = check(source, setup)
    assert c.in_sandbox and c.unsafe(frozenset())


def test_predicate_methods_run_here_on_plain_values_only():
    c = check("assert f(1).startswith('ab') and not g(2).issubset({1, 2})")
    assert c.probes == ["f(1)", "g(2)"] and not c.in_sandbox
    assert c.verdict(values("abc", {3}))[0] == "passed"
    assert c.verdict(values("abc", {1}))[0] == "wrong_answer"
    status, detail = c.verdict(values(["abc"], {3}))
    assert status == "not_plain" and "f(1) is a list" in detail
    # Inside an operand the server cannot split, it is a judgement made in the sandbox.
    assert "calls .startswith()" in check("assert [s.startswith('a') for s in f(1)] == [True]").unsafe()
    assert check("assert Solution().isValid('()')").probes == ["Solution().isValid('()')"]


def test_the_truth_of_what_the_solution_returns_is_its_own_claim():
    c = check("assert is_valid(sample)", "sample = [1, 2]")
    assert c.references == [] and c.unsafe(frozenset()) is None
    # Setup values made with the solution hold the setup's judgement: no reference value.
    for source, setup in [
        ("assert results[0]", "results = [f(1) == 1]"),
        ("assert ok == True", "ok = f(3) == 9"),
        ("assert bool(sample)", "sample = f(1)"),
    ]:
        c = check(source, setup)
        assert c.references == [0] and "computed by the setup code" in c.unsafe(frozenset(), frozenset())


def test_all_and_any_over_known_iterables_are_unrolled_and_decided_here():
    c = check("assert all(f(i) == i * i for i in range(3))")
    assert c.probes == ["f(0)", "f(1)", "f(2)"] and not c.in_sandbox
    assert c.verdict(values(0, 1, 4))[0] == "passed" and c.verdict(values(0, 1, 5))[0] == "wrong_answer"
    c = check("assert any(f(a, b) == c for a, b, c in [(1, 2, 3), (2, 2, 5)] if a > 1)")
    assert c.probes == ["f(1, 2)", "f(2, 2)"] and c.verdict(values(0, 5))[0] == "passed"
    assert c.verdict(values(3, 4))[0] == "wrong_answer"  # the item that equals is filtered out
    c = check("assert all([f(x, y) for x in 'ab' for y in (1, -1)])")
    assert c.probes == ["f('a', 1)", "f('a', -1)", "f('b', 1)", "f('b', -1)"]
    assert c.verdict(values(1, [0], "x", True))[0] == "passed"
    assert c.verdict(values(1, [], "x", True))[0] == "wrong_answer"
    # A variable a lambda rebinds, or a name the setup code binds: left whole.
    assert check("assert all(f(lambda i: i) for i in range(2))").probes == ["all(f(lambda i: i) for i in range(2))"]
    assert check("assert all(f(i) for i in range(2))", "range = list").in_sandbox


def test_values_that_need_no_solution_are_references():
    c = check("assert f(1) == expected", "expected = [1, 2]")
    assert c.probes == ["f(1)", "expected"] and c.references == [1]
    assert c.in_sandbox and c.unsafe(frozenset({1})) is None  # decided here once it is clean
    c = check("assert f(7) == pow(7, 2)")
    assert c.references == [1] and c.unsafe(frozenset({1})) is None
    # An entry point with a builtin's name is the solution's: no reference value for it.
    assert compile_assert("assert pow(2, 3) == 8", frozenset(), frozenset({"pow"})).references == []
    # The solution is handed `data` here: a list's value after the call is the solution's.
    c = check("assert sort_in_place(data) is None and data == [1, 2, 3]", "data = [3, 1, 2]")
    references = {"data": Probe("value", [3, 1, 2])}
    assert c.references == [1] and c.clean(references) == {} and c.computed(references) == {1}
    assert c.unsafe(frozenset(), c.computed(references)) is None
    # A setup value the run without the solution could not compute was made with it.
    assert "is computed by the setup code" in c.unsafe(frozenset(), frozenset())
    c = check("assert normalize(text) == text", "text = 'a b'")
    assert c.unsafe(frozenset(c.clean({"text": Probe("value", [1])}))) is not None
    assert list(c.clean({"text": Probe("value", "a b")})) == [1]
    assert c.clean({"text": Probe("error", detail="NameError")}) == {}
    assert check("assert f(1) == expected", "from helpers import *\nexpected = 1").references == []
    # The solution's own module, star-imported: the names it binds are the solution's.
    bound = setup_names("from solution import *\nexpected = 1", "solution")
    c = compile_assert("assert f(1) == expected", bound)
    assert c.references == [1] and c.unsafe(frozenset({1})) is None


def test_names_the_setup_binds_are_not_the_builtins():
    assert check("assert len(f(1)) == 3", "def len(x):\n    return 3").probes == ["len(f(1))"]
    assert check("assert math.sqrt(f(1)) == 3", "import numpy as math").probes == ["math.sqrt(f(1))"]
    assert check("assert math.sqrt(f(1)) == 3", "import math").probes == ["f(1)"]
    # A generator, a lambda or a keyword not listed: the call is evaluated in the sandbox.
    assert check("assert sorted(f(1), key=len) == ['a']").probes == ["sorted(f(1), key=len)"]
    assert check("assert sum(f(i) for i in range(3)) == 3").probes == ["sum(f(i) for i in range(3))"]


# --- the verdict -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "source, value, status",
    [
        ("assert f() == 3", 3.0, "passed"),  # Python's == between plain numbers
        ("assert f() == 1", True, "passed"),
        ("assert f() is True", 1, "wrong_answer"),
        ("assert f() is True", True, "passed"),
        ("assert f() is None", None, "passed"),
        ("assert f() == [1, 2]", (1, 2), "wrong_answer"),
        ("assert f() == (1, [2])", (1, [2]), "passed"),
        ("assert f() == {1: 'a'}", {1.0: "a"}, "passed"),
        ("assert f() == b'x'", "x", "wrong_answer"),
        ("assert f() == {1, 2}", frozenset({1, 2}), "passed"),
        ("assert f()", [], "wrong_answer"),
        ("assert f()", [0], "passed"),
        ("assert not f()", "", "passed"),
        ("assert f() != 4", 5, "passed"),
        ("assert 0 < f() <= 10", 10, "passed"),
        ("assert 0 < f() <= 10", 11, "wrong_answer"),
        ("assert f() == float('nan')", math.nan, "wrong_answer"),
        ("assert math.isnan(f())", math.nan, "passed"),
        ("assert f() < 3", "a", "error"),  # TypeError, as in Python
        ("assert f()[1:] == 'bc'", "abc", "passed"),
        ("assert f()['k'] == 1", {}, "error"),  # KeyError
        ("assert round(f(), 2) == 0.33", 1 / 3, "passed"),
        ("assert sorted(f(), reverse=True) == [3, 2]", {2, 3}, "passed"),
        ("assert f() == 2 ** 200", 2**200, "passed"),
    ],
)
def test_the_verdict_on_reported_values(source, value, status):
    c = check(source, "import math")
    assert c.verdict(values(value))[0] == status


def test_failures_say_what_the_solution_gave():
    c = check("assert solve(3) == 9, 'squares'")
    assert c.verdict(values(-9)) == ("wrong_answer", "squares: solve(3) = -9")
    assert c.verdict([Probe("error", detail="ValueError: boom")]) == ("error", "solve(3): ValueError: boom")
    assert c.verdict([Probe("error", detail="MemoryError")])[0] == "memory"
    status, detail = c.verdict([Probe("not_plain", detail="type Anything")])
    assert status == "not_plain" and "solve(3) is not a plain value (type Anything)" in detail
    assert c.verdict([Probe("too_large", detail="more than 8 bytes")])[0] == "output_limit"


def test_a_probe_the_verdict_does_not_need_may_fail():
    c = check("assert f() is None or g() == 1")
    assert c.probes == ["f()", "g()"]
    assert c.verdict([Probe("value", None), Probe("error", detail="ZeroDivisionError")])[0] == "passed"
    assert c.verdict([Probe("value", 0), Probe("error", detail="ZeroDivisionError")])[0] == "error"


@pytest.mark.parametrize(
    "source, value",
    [
        ("assert f() * 10 ** 9 == []", [0] * 1000),
        ("assert f() ** 10 ** 6 > 0", 3),
        ("assert f() << 10 ** 9 > 0", 1),
        ("assert f() % 7 == 1", 1 << (1 << 20)),
        ("assert round(f(), -10 ** 9) == 0", 12345),
        ("assert sum(f(), []) == []", [[1]] * 1000),
        ("assert '%s' % f() == 'x'", "x"),
        ("assert int(f()) == 1", "1" * 100_000),
    ],
    ids=["repeat", "pow", "shift", "mod", "round", "sum-lists", "format", "int-of-str"],
)
def test_server_side_operations_past_a_bound_are_refused(source, value):
    status, detail = check(source).verdict(values(value))
    assert status == "error" and ("too large" in detail or "not supported" in detail), detail


COLLIDING = [((1 << 61) - 1) * k for k in range(1, 201)]  # distinct ints, one hash


def test_sets_of_distinct_items_that_share_a_hash_are_refused():
    # Building such a set is quadratic: 8,000 items take seconds, a report can hold 100,000.
    assert len({hash(x) for x in COLLIDING}) == 1
    encoded = [{"int": hex(x)} for x in COLLIDING]
    for value in ({"set": encoded}, {"frozenset": encoded}, {"dict": [[k, 0] for k in encoded]}):
        with pytest.raises(MalformedReport, match="share one hash"):
            read_report(json.dumps({"probes": [{"value": value}]}), 1)
    status, detail = check("assert len(set(f())) == 200").verdict(values(COLLIDING))
    assert status == "error" and "share one hash" in detail
    # Equal items are no attack (each is found at once), nor are a few distinct ones.
    probes = read_report(json.dumps({"probes": [{"value": {"set": [7] * 1000 + encoded[:60]}}]}), 1)
    assert probes[0].value == {7, *COLLIDING[:60]}


# --- reading a report --------------------------------------------------------------------------
def test_a_report_decodes_to_exact_plain_types():
    report = json.dumps(
        {
            "probes": [
                {
                    "value": [
                        1,
                        1.0,
                        True,
                        None,
                        "s",
                        {"int": "-0x10000000000000000"},
                        {"bytes": "00ff"},
                        {"tuple": [1, {"tuple": []}]},
                        {"set": [1, 2]},
                        {"frozenset": ["a"]},
                        {"dict": [[{"tuple": [1, 2]}, [3]], [1, "x"]]},
                    ]
                },
                {"error": "ValueError: boom"},
                {"not_plain": "type Anything"},
                {"too_large": "big"},
            ]
        }
    )
    probes = read_report(report, 4)
    assert [p.kind for p in probes] == ["value", "error", "not_plain", "too_large"]
    value = probes[0].value
    assert [type(v) for v in value] == [int, float, bool, type(None), str, int, bytes, tuple, set, frozenset, dict]
    assert value[5] == -(1 << 64) and value[6] == b"\x00\xff" and value[7] == (1, ())
    assert value[10] == {(1, 2): [3], 1: "x"}


@pytest.mark.parametrize(
    "report",
    [
        "",
        '{"probes": [{"value": 1}]}\n{"probes": [{"value": 1}]}',  # two reports
        '{"probes": [{"value": 1}, {"value": 2}]}',  # a count that is not the probes'
        '{"probes": [{"value": 1}], "extra": 1}',
        '{"probes": [{"value": {"a": 1}}]}',  # a bare object is no value
        '{"probes": [{"value": {"int": "0x1", "int": "0x2"}}]}',
        '{"probes": [{"value": {"int": "12"}}]}',
        '{"probes": [{"value": {"bytes": "0g"}}]}',
        '{"probes": [{"value": {"set": [[1]]}}]}',  # unhashable
        '{"probes": [{"value": {"dict": [[1]]}}]}',
        '{"probes": [{"value": {"Anything": []}}]}',
        '{"probes": [{"passed": true}]}',
        '{"probes": [{"error": 3}]}',
        '{"probes": [{"value": ' + "[" * 150 + "]" * 150 + "}]}",  # deeper than 100
        '{"probes": [{"value": ' + "[" * 100_000 + "]" * 100_000 + "}]}",
        '{"probes": [{"value": ' + "9" * 5000 + "}]}",  # past the int digits limit
    ],
)
def test_anything_but_a_well_formed_report_is_refused(report):
    with pytest.raises(MalformedReport):
        read_report(report, 1)


# --- the runner, as a plain subprocess ---------------------------------------------------------
def exact(a, b) -> bool:
    """Equal with the same types all the way down (and NaN equal to NaN)."""
    if type(a) is not type(b):
        return False
    if type(a) is float:
        return a == b and math.copysign(1, a) == math.copysign(1, b) or a != a and b != b
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(exact(x, y) for x, y in zip(a, b))
    if type(a) is dict:
        return list(a) == list(b) and all(exact(a[k], b[k]) for k in a)
    return a == b


def run_runner(
    tmp_path,
    solution: str,
    probes: list[str],
    setup: str = "",
    max_bytes: int = 1 << 20,
    module: str | None = "solution",
):
    (tmp_path / "solution.py").write_text(solution)
    payload = {"module": module, "setup": setup, "probes": probes, "max_bytes": max_bytes}
    return subprocess.run(
        [sys.executable, "-c", ASSERT_RUNNER],
        cwd=tmp_path,
        capture_output=True,
        input=json.dumps(payload) + "\n",
        text=True,
        timeout=60,
    )


def test_the_runner_reports_plain_values_exactly(tmp_path):
    cases = [
        "None",
        "True",
        "0",
        "-7",
        "2 ** 63",
        "-(2 ** 63)",
        "10 ** 5000",
        "1.5",
        "-0.0",
        "1e300",
        "float('inf')",
        "float('-inf')",
        "float('nan')",
        "0.1 + 0.2",
        "''",
        "'é\\n\"\\\\'",
        "'\\ud800'",
        "b'\\x00\\xff'",
        "[]",
        "()",
        "(1,)",
        "[1, (2, [3.0])]",
        "{1, 2}",
        "frozenset({(1, 2)})",
        "set()",
        "{}",
        "{(1, 2): {'a': [None]}, 1.5: b'', True: 0}",
    ]
    result = run_runner(tmp_path, "x = 1\n", cases)
    assert result.returncode == 0, result.stderr
    probes = read_report(result.stdout, len(cases))
    for source, probe in zip(cases, probes):
        assert probe.kind == "value" and exact(probe.value, eval(source)), (source, probe)


def test_the_runner_reports_what_is_not_a_value(tmp_path):
    solution = (
        "import collections\nclass Int(int):\n    pass\n"
        "def nested():\n    x = []\n    for _ in range(200):\n        x = [x]\n    return x\n"
        "def loop():\n    x = []\n    x.append(x)\n    return x\n"
    )
    probes = [
        "Int(3)",
        "[1, Int(3)]",
        "collections.Counter('ab')",
        "nested()",
        "loop()",
        "1 / 0",
        "'x' * 2000",
        "print('to stderr')",
    ]
    result = run_runner(tmp_path, solution, probes, max_bytes=1000)
    assert result.returncode == 0, result.stderr
    got = read_report(result.stdout, len(probes))
    assert [(p.kind, p.detail) for p in got[:3]] == [("not_plain", "type Int")] * 2 + [("not_plain", "type Counter")]
    assert [p.kind for p in got[3:]] == ["not_plain", "not_plain", "error", "too_large", "value"]
    assert got[5].detail == "ZeroDivisionError: division by zero" and got[7].value is None
    assert "to stderr" in result.stderr  # the solution's prints never reach the report


def test_the_reference_run_never_imports_the_solution(tmp_path):
    cheat = "import builtins\nbuiltins.pow = lambda *a: 0\nraise SystemExit(0)\n"
    result = run_runner(
        tmp_path,
        cheat,
        ["expected", "pow(7, 2)", "f(1)"],
        module=None,
        setup="expected = [i * i for i in range(3)]\ndef f(x):\n    return x\n",
    )
    assert result.returncode == 0, result.stderr
    assert [(p.kind, p.value) for p in read_report(result.stdout, 3)] == [
        ("value", [0, 1, 4]),
        ("value", 49),
        ("value", 1),
    ]
    # The workspace is not on its path; a setup that fails is every probe's error.
    result = run_runner(tmp_path, cheat, ["expected", "1"], module=None, setup="from solution import *\nexpected = 1")
    got = read_report(result.stdout, 2)
    assert [p.kind for p in got] == ["error", "error"] and "ModuleNotFoundError" in got[0].detail


def test_assignments_only_reference_values_need_stay_out_of_the_solutions_process():
    setup = (
        "import sys\nsys.setrecursionlimit(10000)\ndata = [3, 1, 2]\nexpected = sorted(data)\n"
        "total = sum(expected)\nwanted = [1, 4]\nlog = []\nnoted = log.append(1)\n"
    )
    asserts = ["assert f(data) == expected", "assert f(data) == wanted and g(1) == total"]
    plan = HiddenTests("asserts", [], setup, asserts, 4.0, 512)
    first, second = plan.checks
    # `expected` is read by `total = ...`, which stays for this check: so it stays too.
    assert plan.setup_for(first, {1: Probe("value", [1, 2, 3])}) == setup
    kept = plan.setup_for(second, {1: Probe("value", [1, 4]), 3: Probe("value", 6)})
    assert "wanted" not in kept and "total" not in kept and "noted = log.append(1)" in kept
    assert "expected = sorted(data)" in kept and "setrecursionlimit" in kept
    assert plan.setup_for(first, {}) == setup
