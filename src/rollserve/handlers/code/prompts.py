"""What a coding agent reads: a short system prompt in the style of current coding
agents, and the task (also the workspace's README.md)."""

from __future__ import annotations

from rollserve.handlers.code.hidden_tests import HiddenTests
from rollserve.sandbox.base import WORKDIR

SYSTEM_PROMPT = """\
You are an expert software engineer working as an autonomous coding agent in a \
sandboxed Linux machine with Python 3 and no internet access. Your job is to solve a \
programming problem with a correct, efficient Python program.

How to work:
- The problem is in /workspace/README.md; your solution goes in the file it names.
- Each reply: think briefly, then call a tool. Create and edit files with \
str_replace_editor; run commands with bash (e.g. `python3 solution.py < in.txt`).
- Test your solution on the examples and on edge cases of your own before you submit. \
Hidden tests with the same format, and time and memory limits, decide whether it is accepted.
- When the solution is complete and tested, call submit. That ends the task."""


def task_text(problem: str, plan: HiddenTests, solution_file: str, entry_point: str | None) -> str:
    """The task as the agent reads it (also the workspace's README.md)."""
    if plan.style == "stdio":
        how = (
            f"Write your solution in Python 3 to {WORKDIR}/{solution_file}. It is run as "
            f"`python3 {solution_file}`: read the input from standard input and write the "
            "answer to standard output."
        )
    else:
        module = solution_file.removesuffix(".py")
        what = f"define `{entry_point}`" if entry_point else "define the functions the problem asks for"
        how = (
            f"Write your solution in Python 3 to {WORKDIR}/{solution_file} and {what}. The tests "
            f"import it (`from {module} import *`), so do not read input or run code at import "
            "time."
        )
    limits = f"Limits per test: {plan.time_limit:g} s of CPU time and {plan.memory_limit_mb} MB of memory."
    return f"{problem.strip()}\n\n## Your task\n\n{how}\n{limits}\nWhen you are done, call submit."
