"""The candidate patch: taken from the workspace after the episode, applied before
the tests, as SWE-bench does.

- Taken: ``git add -A`` then ``git diff --cached <baseline>``: every change,
  committed or not, new files included, ignored files (``.gitignore``) not. The
  baseline is the tree of the workspace when the episode began (``snapshot``), so
  files an environment image left untracked or modified are not the agent's. Binary
  files are left out (SWE-bench patches are text; ``git apply`` cannot use "Binary
  files differ") and named in the details. Changes to test files stay in the patch;
  EVAL resets the files the test patch touches before applying it, as SWE-bench's
  eval script does.
  git runs with no configuration of the agent's: the workspace's ``.git/config`` is
  replaced by a minimal one first (``TRUSTED_GIT``), global and system files are
  ignored and the diff's format is pinned on its command line, so ``diff.noprefix``
  (``x/iniconfig.py``: ``-p1`` would write a root ``iniconfig.py``), mnemonic or custom
  prefixes, textconv, an external diff, colour, an fsmonitor or a clean filter (code
  of the agent's run by git) neither change the patch nor run. The patch is still the
  agent's text: ``protect.split`` reads it strictly.
Commands run where every sandbox command starts: the workspace, the repository.

- Applied: ``git apply --verbose``, then ``git apply --verbose --reject``, then
  ``patch --batch --fuzz=5 -p1`` (SWE-bench's sequence); the first that works wins.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from rollserve.errors import InfraError
from rollserve.sandbox.base import Sandbox

APPLY_COMMANDS = ("git apply --verbose", "git apply --verbose --reject", "patch --batch --fuzz=5 -p1 -i")
PATCH_FILE = ".git/rollserve-candidate.diff"  # in the sandbox's repository, never in a diff
MAX_PATCH_BYTES = 4 << 20


@dataclass
class Candidate:
    patch: str
    binary_files: list[str] = field(default_factory=list)  # left out of the patch
    too_big: bool = False  # over MAX_PATCH_BYTES: cut, so it cannot be applied

    @property
    def empty(self) -> bool:
        return not self.patch.strip()


async def snapshot(sandbox: Sandbox, timeout: float = 120.0) -> str:
    """The git tree of the workspace as it is (tracked or not, ignored files aside),
    recorded without changing the index, HEAD or any file the agent sees."""
    result = await sandbox.exec("git add -A && git write-tree && git reset -q", timeout=timeout)
    tree = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    if not result.ok or len(tree) < 40:
        raise InfraError(f"git could not snapshot the workspace: {result.failure()}")
    return tree


# The workspace's git as the environment made it: only what git needs to read the
# repository (its object format), nothing of the agent's (filters, drivers, hooks,
# includes, prefixes). Global and system files are not read; safe.directory is given
# on the command line, where git honours it (an image's repository has another owner).
TRUSTED_GIT = (
    "if [ -L .git ] || [ ! -d .git ] || [ -L .git/config ]; then "
    'echo "the workspace\'s .git is not a plain folder" >&2; exit 3; fi; '
    "format=$(GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null "
    "git config --file .git/config --get extensions.objectformat 2>/dev/null); "
    'case "$format" in sha256) version=1 ;; *) format= version=0 ;; esac; '
    'rm -f .git/config.worktree && {{ printf "[core]\\n\\trepositoryformatversion = %s\\n'
    '\\tbare = false\\n" "$version"; '
    '[ -n "$format" ] && printf "[extensions]\\n\\tobjectformat = %s\\n" "$format"; '
    "true; }} > .git/config && "
    "export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null GIT_ATTR_NOSYSTEM=1 && "
    'git() {{ command git -c safe.directory="*" -c core.fsmonitor=false '
    '-c core.hooksPath=/dev/null -c core.attributesFile=/dev/null "$@"; }} && {command}'
)
# The diff's format, whatever any configuration says.
DIFF_OPTIONS = "--no-color --no-ext-diff --no-textconv --src-prefix=a/ --dst-prefix=b/ --no-relative --no-renames"


async def take_patch(sandbox: Sandbox, baseline: str, timeout: float = 120.0) -> Candidate:
    """The workspace's changes against ``baseline`` (a tree or commit)."""
    base = shlex.quote(baseline)
    stage = await sandbox.exec(
        TRUSTED_GIT.format(command=f"git add -A && git diff --cached {DIFF_OPTIONS} --numstat {base}"), timeout=timeout
    )
    if not stage.ok:
        raise InfraError(f"git could not list the workspace's changes: {stage.failure()}")
    binary = [line.split("\t", 2)[2] for line in stage.stdout.splitlines() if line.startswith("-\t-\t")]
    excludes = " ".join(shlex.quote(f":(exclude,literal){path}") for path in binary)
    diff = await sandbox.exec(
        TRUSTED_GIT.format(command=f"git diff --cached {DIFF_OPTIONS} {base} -- . {excludes}"),
        timeout=timeout,
        max_output=MAX_PATCH_BYTES,
    )
    if not diff.ok:
        raise InfraError(f"git diff failed: {diff.failure()}")
    # A patch over the cap is the agent's doing (vendored files, generated data).
    return Candidate(patch=diff.stdout, binary_files=binary, too_big=diff.truncated)


@dataclass
class Applied:
    ok: bool
    command: str | None  # the command that applied it
    log: str


async def apply_patch(sandbox: Sandbox, patch: str, timeout: float = 120.0) -> Applied:
    """Apply ``patch`` in the workspace with SWE-bench's fallbacks."""
    await sandbox.write_file(PATCH_FILE, patch)
    logs = []
    for command in APPLY_COMMANDS:
        result = await sandbox.exec(f"{command} {PATCH_FILE}", timeout=timeout)
        logs.append(f"$ {command}\n{(result.stdout + result.stderr).strip()}")
        if result.ok:
            return Applied(True, command, "\n".join(logs)[-4000:])
        # Undo a partial application (--reject leaves .rej files and applied hunks).
        await sandbox.exec("git checkout -q -- . && git clean -fdq", timeout=timeout)
    return Applied(False, None, "\n".join(logs)[-4000:])
