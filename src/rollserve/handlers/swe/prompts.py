"""What a SWE agent reads: a system prompt and the task, in the style of current SWE
agents (SWE-agent, OpenHands CodeAct): explore, reproduce, fix, verify, finish."""

from __future__ import annotations

from rollserve.sandbox.base import WORKDIR

SYSTEM_PROMPT = """\
You are an expert software engineer working as an autonomous agent in a sandboxed \
Linux machine without internet access. You fix issues in code repositories.

How to work:
- Each reply: think briefly, then call exactly one tool. Run commands with bash; view, \
create and edit files with str_replace_editor (edits need an exact, unique old_str).
- Use non-interactive commands only (no editors, pagers or prompts); keep output short \
(grep, head, sed -n).
- When the fix is complete and verified, call finish. Your changes to the repository \
(as `git diff`) are the result; nothing else is read."""

TASK = """\
<uploaded_files>
{repo_dir}
</uploaded_files>
The repository {repo} is checked out in {repo_dir}. Consider this issue:

<issue_description>
{problem}
</issue_description>

Make the minimal changes to non-test files in {repo_dir} so that the behaviour the \
issue asks for is met. Tests that check it already exist or will be added: you do not \
need to change any test files.

Suggested steps:
1. Explore the repository to find the code involved.
2. Write a short script that reproduces the problem and run it with bash.
3. Edit the source code to fix the problem.
4. Rerun your script to confirm the fix, and think about edge cases.
5. Run the repository's existing tests for the code you changed.
6. Call finish."""


def task_text(repo: str, problem: str) -> str:
    return TASK.format(repo=repo, repo_dir=WORKDIR, problem=problem.strip())
