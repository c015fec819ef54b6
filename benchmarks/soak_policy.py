"""The scripted policy of the soak benchmark (``benchmarks/soak.py``), loaded by the
test-double vLLM (``python -m rollserve.testing.fake_vllm --script``).

Every soak task carries a tag ``[soak KIND ARG MODE]`` in its text; the reply is keyed
on the tag and on the assistant turns so far:

- ``math IDX``: the bundled math task IDX's answer, boxed (one turn);
- ``code TASK_ID MODE``: the editor writes the task's reference solution, bash runs a
  command (``slow``: a 30 s sleep, so a cancel lands in the middle of a sandbox
  command), then submit;
- ``gw N``: the number N (the gateway harness's script asks twice and prints it).
"""

from __future__ import annotations

import re

from tests.handlers.code_references import REFERENCE

from rollserve.agent.tool_calls import format_tool_call
from rollserve.datasets import bundled_rows

TAG = re.compile(r"\[soak (\w+) ([\w-]+)(?: (\w+))?\]")
MATH = [row["answer"] for row in bundled_rows("math") if "question" in row]  # (not the generated ones)
SLOW = "sleep 30"
QUICK = "python3 -c 'print(6 * 7)'"


def reply(prompt_ids: list[int], prompt: str) -> str:
    found = TAG.findall(prompt)
    if not found:
        return "I do not know."
    kind, arg, mode = found[-1]
    turn = prompt.count("<|im_start|>assistant") - 1
    if kind == "math":
        return f"Let me compute. The answer is \\boxed{{{MATH[int(arg) % len(MATH)]}}}."
    if kind == "gw":
        return arg
    if turn == 0:
        return "I will write it.\n" + format_tool_call(
            "str_replace_editor",
            {"command": "create", "path": "/workspace/solution.py", "file_text": REFERENCE[arg]},
        )
    if turn == 1:
        return format_tool_call("bash", {"command": SLOW if mode == "slow" else QUICK})
    return "Done.\n" + format_tool_call("submit", {})
