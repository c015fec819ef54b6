"""Every number on docs/benchmarks.md comes from a file in benchmarks/results/: each
section (a bold title, then the command that measured it) is checked against the JSON
its command writes (``python -m benchmarks.NAME`` -> ``results/NAME.json``) and any
``results/NAME.json`` it names. A number matches when some number in those files,
as it is, rounds to it at the precision shown; scaled by 100 only when ``%`` follows
it, by 1000 or 1/1000 only when a time unit (``s``, ``ms``, ``µs``) does. Code spans
(commands, options) are not checked, nor a paragraph after a ``<!-- derived: ... -->``
line (arithmetic on the numbers above, which says so)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

from tests.docs.snippets import ROOT

PAGE = ROOT / "docs" / "benchmarks.md"
RESULTS = ROOT / "benchmarks" / "results"
NUMBER = re.compile(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?")
SECTION = re.compile(r"\n(?=\*\*[^*\n]+\*\* \()")
DERIVED = re.compile(r"<!-- derived: [^>]+ -->\n.*?(?:\n\n|\Z)", re.S)


def _numbers_in(value: object) -> Iterator[float]:
    if isinstance(value, bool):
        return
    if isinstance(value, int | float):
        yield float(value)
    elif isinstance(value, str):  # a table cell such as "12.0 / 483.2" or "8/8/64"
        yield from (float(n) for n in re.findall(r"-?\d+(?:\.\d+)?", value))
    elif isinstance(value, dict):
        for item in value.values():
            yield from _numbers_in(item)
    elif isinstance(value, list):
        for item in value:
            yield from _numbers_in(item)


def _scales(after: str) -> tuple[float, ...]:
    """The scales a number may be shown at, by the unit written after it: x100 only as a
    share (``%``), x1000 or /1000 only as a time (``s``, ``ms``, ``µs``)."""
    if re.match(r"\s?%", after):
        return (1, 100)
    if re.match(r"\s?(?:ms|s|µs)\b", after):
        return (1, 1000, 0.001)
    return (1,)


def _matches(shown: str, measured: list[float], after: str = "") -> bool:
    text = shown.replace(",", "")
    places = len(text.split(".")[1]) if "." in text else 0
    x = float(text)
    half_unit = 0.5 * 10**-places + 1e-9
    return any(abs(v * k - x) <= half_unit for v in measured for k in _scales(after))


def unmatched(section: str, results: Path = RESULTS) -> tuple[set[str], list[str]]:
    """(the result files a section cites, its numbers that none of them holds)."""
    names = set(re.findall(r"benchmarks\.(\w+)", section)) | set(re.findall(r"results/(\w+)\.json", section))
    measured = [
        n
        for name in sorted(names)
        if (results / f"{name}.json").is_file()
        for n in _numbers_in(json.loads((results / f"{name}.json").read_text()))
    ]
    prose = re.sub(r"`[^`]*`", "", DERIVED.sub("", section))
    return names, [
        m.group() for m in NUMBER.finditer(prose) if not _matches(m.group(), measured, prose[m.end() : m.end() + 4])
    ]


def sections() -> list[str]:
    return SECTION.split(PAGE.read_text())[1:]


def test_every_number_on_the_benchmarks_page_is_in_its_results_file() -> None:
    found = sections()
    assert len(found) >= 9, "the page's sections are no longer split where expected"
    problems = []
    for section in found:
        names, missing = unmatched(section)
        title = section.split("**")[1]
        absent = [n for n in names if not (RESULTS / f"{n}.json").is_file()]
        if not names or absent:
            problems.append(f"{title}: cites no results file that exists ({sorted(names)})")
        if missing:
            problems.append(f"{title}: {missing} not in {sorted(names)}")
    assert not problems, "\n".join(problems)


def test_a_number_no_results_file_holds_is_caught(tmp_path: Path) -> None:
    (tmp_path / "demo.json").write_text(json.dumps({"rows": [["bwrap", 14.739, "12.0 / 483.2"]], "share": 0.94}))
    ok = "**Demo** (`python -m benchmarks.demo`): 14.7 ms, p99 483 ms, 94% busy."
    assert unmatched(ok, tmp_path) == ({"demo"}, [])
    assert unmatched(ok.replace("14.7", "14.1"), tmp_path)[1] == ["14.1"]
    assert unmatched(ok + "\n\n<!-- derived: x -->\n8,192 in flight.\n", tmp_path)[1] == []


def test_a_number_matches_at_a_scale_only_with_its_unit() -> None:
    """x100 only before %, x1000 or /1000 only before a time unit: a bare 200 is not
    0.2 s, nor 2 a share of 0.02."""
    assert _matches("200", [0.2], " ms ") and not _matches("200", [0.2], " rol")
    assert _matches("2", [0.02], "% of") and not _matches("2", [0.02], " run")
    assert _matches("7", [7.0], "") and not _matches("8", [7.0], "")
