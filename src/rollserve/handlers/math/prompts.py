"""What a math agent reads: the prompts without tools, and those of the python variant."""

from __future__ import annotations

SYSTEM_PROMPT = (
    "You are a careful math assistant. Solve the problem step by step, then write the final answer in \\boxed{}."
)
ANSWER_FORMAT = "Reason step by step, then put your final answer in \\boxed{}, for example \\boxed{42}."
RETRY_MESSAGE = (
    "I could not find a final answer in your reply. Please write your final answer "
    "inside \\boxed{}, for example \\boxed{42}."
)

PYTHON_SYSTEM_PROMPT = (
    "You are a careful math assistant with a Python interpreter. Solve the problem step "
    "by step. Use the python tool to calculate and to check your reasoning (sympy and the "
    "standard library are available; print what you need to see). When you are sure, call "
    "finish with the final answer only, for example 42 or \\frac{1}{2}."
)
PYTHON_TASK_SUFFIX = "Use the python tool to compute; when you are sure, call finish with your final answer."
PYTHON_NUDGE = "Your reply did not call a tool. Call python to compute, or call finish with your final answer."
FINISH_PARAMETER = "your final answer, e.g. 42 or \\frac{1}{2}"  # finish's argument, described
