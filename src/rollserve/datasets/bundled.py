"""The task sets shipped with rollserve: one table, by name.

Each set is a JSONL file under ``rollserve/data`` whose rows are instances of one data
source (plus the set's own name for each row: ``task_id``, or the SWE-bench
``instance_id``). Everything that uses a bundled set finds it here: ``rollserve
datasets validate | images pull | run NAME``, the quickstart, the swe handler (swe-mini's
git bundles) and the tests.
"""

from __future__ import annotations

import importlib.resources
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollserve.datasets.files import read_records

DATA_DIR = Path(str(importlib.resources.files("rollserve") / "data"))


@dataclass(frozen=True)
class BundledSet:
    """One bundled set: its rows' file (under ``DATA_DIR``) and their data source."""

    name: str  # what commands take in place of a file: ``rollserve run swe-mini``
    file: str  # relative to DATA_DIR
    data_source: str  # the handler every row is an instance of
    holds: str  # what it holds, in a sentence

    @property
    def path(self) -> Path:
        return DATA_DIR / self.file

    def rows(self) -> list[dict[str, Any]]:
        """Every row, in file order: an instance plus the set's name for it (``task_id``,
        which handlers ignore; swe-mini's rows are SWE-bench records)."""
        rows = []
        for number, record in read_records(self.path):
            if not isinstance(record, dict):
                raise ValueError(f"{self.path}, line {number}: not a JSON object")
            rows.append(record)
        return rows


SWE_MINI = BundledSet(
    "swe-mini",
    "swe_mini/instances.jsonl",
    "swe",
    "15 instances in the SWE-bench schema over 5 small Python libraries made for rollserve, "
    "with one git bundle per instance (rebuilt by scripts/swe_mini/build.py)",
)
BUNDLED: dict[str, BundledSet] = {
    s.name: s
    for s in (
        SWE_MINI,
        BundledSet("code", "code_tasks.jsonl", "code", "programming problems with hidden stdin/stdout or assert tests"),
        BundledSet(
            "stem",
            "stem_tasks.jsonl",
            "stem",
            "science questions: MMLU and GPQA multiple choice, numbers with units, short answers",
        ),
        BundledSet(
            "math",
            "math_tasks.jsonl",
            "math",
            "arithmetic and school math word problems with LaTeX or numeric gold answers",
        ),
        BundledSet(
            "easy",
            "easy_tasks.jsonl",
            "stem",
            "two-choice questions (single-digit sums, everyday science) that a 135M model "
            "answers right some of the time: the quickstart's",
        ),
    )
}
# swe-mini's repositories: one git bundle per instance, which the swe handler reads as a
# mirror every server has.
SWE_MINI_BUNDLES = SWE_MINI.path.parent / "bundles"


def bundled_set(name: str) -> BundledSet:
    """The bundled set ``name``; a KeyError listing the known names if there is none."""
    try:
        return BUNDLED[name]
    except KeyError:
        raise KeyError(f"no bundled set {name!r} (bundled: {', '.join(BUNDLED)})") from None


def bundled_rows(name: str) -> list[dict[str, Any]]:
    """The rows of the bundled set ``name`` (see ``BundledSet.rows``)."""
    return bundled_set(name).rows()
