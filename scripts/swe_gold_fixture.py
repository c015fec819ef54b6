"""Build tests/handlers/swe/data/gold_patches.json.gz: the non-test Python changes of
real upstream pull requests that SWE-bench instances come from (their gold patches),
as excerpts of each changed file before and after (see that folder's README).

    python scripts/swe_gold_fixture.py OUT.json.gz REPO_GIT_DIR:OWNER/NAME:PR[,PR...] ...

REPO_GIT_DIR is a clone of OWNER/NAME; each PR is found in its history by its number
("Merge pull request #N" or a squash "(#N)")."""

from __future__ import annotations

import ast
import gzip
import json
import re
import subprocess
import sys
from pathlib import Path


def _load(name: str):  # the two modules alone (rollserve's dependencies not needed)
    import importlib.util
    path = Path(__file__).resolve().parents[1] / "src/rollserve/handlers/swe" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


machinery, protect = _load("machinery"), _load("protect")


def git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", repo, *args], check=True, capture_output=True,
                          text=True, errors="surrogateescape").stdout


def find(repo: str, number: str) -> tuple[str, str] | None:
    """(parent, commit) of pull request ``number``: its merge, else its squashed commit."""
    for pattern in (rf"^Merge pull request #{number} ", rf"\(#{number}\)$"):
        hits = git(repo, "log", "--all", "--format=%H %P", "-E", f"--grep={pattern}").split("\n")
        for line in hits:
            if line.strip():
                commit, parent = line.split()[:2]
                return parent, commit
    return None


def _span(node: ast.stmt) -> tuple[int, int]:
    start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
    return start, node.end_lineno or node.lineno


def _reduce(body: list[ast.stmt], lines: list[tuple[int, int]], top: bool) -> list[ast.stmt]:
    """The statements of ``body`` a hunk touches (a class: its touched members), and at
    the top the module's imports."""
    kept: list[ast.stmt] = []
    for node in body:
        start, end = _span(node)
        touched = any(a <= end and start <= b for a, b in lines)
        imports = top and (isinstance(node, (ast.Import, ast.ImportFrom)) or (
            isinstance(node, (ast.Try, ast.If)) and any(
                isinstance(n, (ast.Import, ast.ImportFrom)) for n in node.body)))
        if isinstance(node, ast.ClassDef) and touched:
            inner = [n for n in node.body if any(a <= _span(n)[1] and _span(n)[0] <= b
                                                 for a, b in lines)]
            if inner and len(inner) < len(node.body):
                node.body = _reduce(node.body, lines, False) or [ast.Pass()]
            kept.append(node)
        elif touched or imports:
            kept.append(node)
    return kept


def excerpt(source: str, lines: list[tuple[int, int]]) -> str | None:
    """The module's imports and the statements overlapping ``lines`` (members of a
    class one by one), unparsed."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    return ast.unparse(ast.Module(body=_reduce(tree.body, lines, True), type_ignores=[])) + "\n"


def hunks(repo: str, parent: str, commit: str, path: str) -> tuple[list, list]:
    old, new = [], []
    for m in re.finditer(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@",
                         git(repo, "diff", "-U0", parent, commit, "--", path), re.MULTILINE):
        a, b, c, d = int(m[1]), int(m[2] or 1), int(m[3]), int(m[4] or 1)
        old.append((a, a + max(b, 1)))
        new.append((c, c + max(d, 1)))
    return old, new


def pull(repo: str, name: str, number: str) -> dict | None:
    found = find(repo, number)
    if found is None:
        print(f"{name}#{number}: not found", file=sys.stderr)
        return None
    parent, commit = found
    files = []
    for line in git(repo, "diff", "--name-status", parent, commit).splitlines():
        status, *paths = line.split("\t")
        path = paths[-1]
        if not path.endswith(".py") or protect.is_protected(path) or status.startswith("D"):
            continue
        old_lines, new_lines = hunks(repo, parent, commit, path)
        before = None if status == "A" else git(repo, "show", f"{parent}:{paths[0]}")
        after = git(repo, "show", f"{commit}:{path}")
        files.append({"path": path, "before": before and excerpt(before, old_lines),
                      "after": excerpt(after, new_lines)})
    if not files:
        return None
    tree = git(repo, "ls-tree", "-r", "--name-only", parent).splitlines()
    return {"repo": name, "pull": int(number), "parent": parent, "commit": commit,
            "own": sorted(machinery.own_packages(tree)), "files": files}


def main() -> None:
    out, specs = sys.argv[1], sys.argv[2:]
    pulls = []
    for spec in specs:
        repo, name, numbers = spec.split(":")
        for number in numbers.split(","):
            row = pull(repo, name, number)
            if row:
                pulls.append(row)
    with gzip.open(out, "wt", encoding="utf-8") as handle:
        json.dump(pulls, handle, indent=0, sort_keys=True)
    print(f"{len(pulls)} pulls, {sum(len(p['files']) for p in pulls)} files -> {out}")


if __name__ == "__main__":
    main()
