"""Re-scoring a stored swe result: its candidate patch as its evaluation kept it.

EVAL's details keep the candidate patch in full (``git_patch``, as ``take_patch`` took
it: at most ``MAX_PATCH_BYTES``, 4 MiB; a patch over that was cut, flagged
``patch_too_big`` and scored 0, as it is again), with ``finished`` and, for a harness
run, the harness's exit code and log tail. Re-scoring runs the same EVAL on that patch
(a fresh sandbox, the protected files, the machinery scan, the canaries, the second
runner) with the server's swe options as they are now. Only a completed result is
scored again (re-scoring refuses any other before asking the family: an infra failure
or a timeout, masked, or the patch's own failure in EVAL, reward 0, keeps no
evaluation); one whose evaluation holds no patch has nothing to score again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rollserve.handlers.harness import HarnessOutput
from rollserve.handlers.swe.patch import MAX_PATCH_BYTES, Candidate


def problem(evaluation: Mapping[str, Any] | None) -> str | None:
    """Why ``evaluation`` (a stored completed swe result's) cannot be scored again
    (None: it can)."""
    if not isinstance((evaluation or {}).get("git_patch"), str):
        return "it keeps no evaluation with a candidate patch (git_patch) to score again"
    return None


def candidate(evaluation: Mapping[str, Any]) -> tuple[Candidate, bool, HarnessOutput | None]:
    """(the candidate, whether the agent finished, the harness's output or None)."""
    patch = str(evaluation["git_patch"])
    binary = evaluation.get("binary_files_left_out")
    too_big = evaluation.get("patch_too_big")
    if not isinstance(too_big, bool):  # (results stored before the flag: by its size)
        too_big = len(patch.encode()) >= MAX_PATCH_BYTES
    harness = None
    if "harness_exit_code" in evaluation:
        code = evaluation["harness_exit_code"]
        harness = HarnessOutput(exit_code=code if isinstance(code, int) else None)
        harness.keep(str(evaluation.get("harness_log_tail") or ""))
    return (
        Candidate(
            patch=patch, too_big=too_big, binary_files=[str(b) for b in binary] if isinstance(binary, list) else []
        ),
        evaluation.get("finished") is True,
        harness,
    )
