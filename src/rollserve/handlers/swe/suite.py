"""``swe-mini``: the bundled offline SWE suite (small Python repositories made for
rollserve, one git bundle per instance; rebuilt and verified by
``scripts/swe_mini/build.py``). The swe handler finds the bundles by itself."""

from __future__ import annotations

import importlib.resources
import json
from pathlib import Path
from typing import Any


def swe_mini_path() -> Path:
    """The suite's instances file (SWE-bench schema, one JSON object per line)."""
    return Path(str(importlib.resources.files("rollserve") / "data" / "swe_mini" / "instances.jsonl"))


def swe_mini() -> list[dict[str, Any]]:
    """Every swe-mini instance, sorted by instance_id."""
    lines = swe_mini_path().read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]
