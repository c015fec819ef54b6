#!/usr/bin/env python3
"""Build and verify swe-mini, rollserve's bundled offline SWE-bench-style suite.

Inputs (all under scripts/swe_mini/):

  repos/<repo>/tree/          the repository as it is at every instance's parent commit
  repos/<repo>/history.json   the commits leading there: message + files each adds or
                              changes; history/<k>/<path> holds a file's earlier
                              content at commit k (otherwise tree/<path> is used)
  bugs/<repo>/<n>/
      issue.md                the problem statement (title line, blank line, body)
      instance.json           {"summary": ..., "base_commit_message": ...}
      base.diff               the instance's own last commit (unrelated to the bug), so
                              that each instance has its own base commit
      fix.diff                the gold patch (non-test files only)
      test.diff               the test patch (tests/ only)

Outputs (src/rollserve/data/swe_mini/):

  instances.jsonl             one SWE-bench record per instance, sorted by instance_id
  bundles/<instance_id>.bundle  git bundle of HEAD and main, both at base_commit

Every instance is verified before anything is written: clone the bundle, apply the
test patch, run ``python -m pytest -rA -p no:cacheprovider <test files of the test
patch>``; apply the gold patch and run again (and the whole suite once more).
FAIL_TO_PASS / PASS_TO_PASS are computed from those runs.

Usage:
  python scripts/swe_mini/build.py             rebuild, verify, write the outputs
  python scripts/swe_mini/build.py --check     rebuild in a temp dir and compare with the
                                               committed outputs (exit 1 on a difference)
  python scripts/swe_mini/build.py --scratch ID DIR
                                               check out a repo (ID = <repo>) or an
                                               instance's base commit (ID = <repo>-<n> or
                                               the full instance id) into DIR for authoring
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
REPOS_DIR = HERE / "repos"
BUGS_DIR = HERE / "bugs"
OUT_DIR = ROOT / "src" / "rollserve" / "data" / "swe_mini"

ID_PREFIX = "rollserve-mini__"
REPO_ORG = "rollserve-mini"
FIELDS = (
    "instance_id",
    "repo",
    "base_commit",
    "patch",
    "test_patch",
    "problem_statement",
    "hints_text",
    "created_at",
    "version",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
    "environment_setup_commit",
)
MIN_PASS_TO_PASS = 3
PYTEST_TIMEOUT_S = 120
IGNORED_NAMES = {".git", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"}
TEST_ID_RE = re.compile(r"^tests/[A-Za-z0-9_/]+\.py::[A-Za-z_][A-Za-z0-9_]*$")
STATUS_RE = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS)\s+(\S+)")


class BuildError(Exception):
    """The suite cannot be built or an instance failed verification."""


# ---------------------------------------------------------------------------
# git plumbing


def _git_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """An environment isolated from the user's git configuration."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_TERMINAL_PROMPT="0",
        LC_ALL="C",
        TZ="UTC",
    )
    if extra:
        env.update(extra)
    return env


_GIT_CONFIG = (
    "-c", "init.defaultBranch=main",
    "-c", "commit.gpgsign=false",
    "-c", "tag.gpgsign=false",
    "-c", "core.autocrlf=false",
    "-c", "core.fileMode=true",
    "-c", "advice.detachedHead=false",
    "-c", "diff.noprefix=false",
    "-c", "diff.mnemonicPrefix=false",
    "-c", "diff.renames=false",
)


def git(cwd: Path, *args: str, env: Optional[Dict[str, str]] = None, input: Optional[str] = None) -> str:
    proc = subprocess.run(
        ["git", *_GIT_CONFIG, *args],
        cwd=cwd,
        env=_git_env(env),
        input=input,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise BuildError(f"git {' '.join(args)} failed in {cwd}:\n{proc.stdout}{proc.stderr}")
    return proc.stdout


def _git_date(when: datetime) -> str:
    return f"@{int(when.timestamp())} +0000"


def commit_all(repo: Path, message: str, author: Dict[str, str], when: datetime) -> str:
    """Commit the index with a fixed identity and date; return the commit hash."""
    date = _git_date(when)
    env = {
        "GIT_AUTHOR_NAME": author["name"],
        "GIT_AUTHOR_EMAIL": author["email"],
        "GIT_AUTHOR_DATE": date,
        "GIT_COMMITTER_NAME": author["name"],
        "GIT_COMMITTER_EMAIL": author["email"],
        "GIT_COMMITTER_DATE": date,
    }
    git(repo, "commit", "-q", "--no-verify", "--allow-empty-message", "-F", "-", env=env, input=message.rstrip() + "\n")
    return git(repo, "rev-parse", "HEAD").strip()


def diff_paths(diff: str) -> List[str]:
    """Paths a unified git diff touches (new side, or old side for deletions)."""
    paths = []
    for line in diff.splitlines():
        if line.startswith("diff --git "):
            m = re.match(r"diff --git a/(.+) b/(.+)$", line)
            if not m:
                raise BuildError(f"cannot parse diff header: {line!r}")
            paths.append(m.group(2))
    return paths


def staged_diff(repo: Path) -> str:
    """The staged changes as `git diff` prints them (a/ and b/ prefixes)."""
    return git(repo, "diff", "--cached", "--no-color", "--no-ext-diff", "--src-prefix=a/", "--dst-prefix=b/")


def apply_diff(repo: Path, diff_text: str, what: str, index: bool = True) -> None:
    args = ["apply", "--whitespace=nowarn"] + (["--index"] if index else []) + ["-"]
    try:
        git(repo, *args, input=diff_text)
    except BuildError as exc:
        raise BuildError(f"{what} does not apply: {exc}") from None


# ---------------------------------------------------------------------------
# specs


@dataclass
class CommitSpec:
    message: str
    files: List[str]


@dataclass
class RepoSpec:
    name: str
    version: str
    author: Dict[str, str]
    start: datetime
    commits: List[CommitSpec]

    @property
    def root(self) -> Path:
        return REPOS_DIR / self.name

    def commit_date(self, k: int) -> datetime:
        """Date of shared commit k (1-based): commits are a few days apart."""
        return self.start + timedelta(days=3 * (k - 1), hours=2 * (k - 1), minutes=17 * (k - 1))

    @property
    def last_date(self) -> datetime:
        return self.commit_date(len(self.commits))


@dataclass
class BugSpec:
    repo: str
    number: int
    summary: str
    base_message: str
    issue: str
    base_diff: str
    fix_diff: str
    test_diff: str

    @property
    def instance_id(self) -> str:
        return f"{ID_PREFIX}{self.repo}-{self.number}"

    @property
    def dir(self) -> Path:
        return BUGS_DIR / self.repo / str(self.number)


def _parse_time(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)


def load_repo(name: str) -> RepoSpec:
    spec = json.loads((REPOS_DIR / name / "history.json").read_text(encoding="utf-8"))
    commits = [CommitSpec(c["message"], list(c["files"])) for c in spec["commits"]]
    if not 1 <= len(commits) <= 3:
        raise BuildError(f"{name}: history.json must list 1-3 shared commits")
    return RepoSpec(name, spec["version"], spec["author"], _parse_time(spec["start"]), commits)


def load_bug(repo: str, number: int) -> BugSpec:
    d = BUGS_DIR / repo / str(number)

    def read(name: str) -> str:
        path = d / name
        if not path.is_file():
            raise BuildError(f"{d}: missing {name}")
        return path.read_text(encoding="utf-8")

    meta = json.loads(read("instance.json"))
    return BugSpec(
        repo=repo,
        number=number,
        summary=meta["summary"],
        base_message=meta["base_commit_message"],
        issue=read("issue.md").strip() + "\n",
        base_diff=read("base.diff"),
        fix_diff=read("fix.diff"),
        test_diff=read("test.diff"),
    )


def discover_repos() -> Dict[str, RepoSpec]:
    return {p.name: load_repo(p.name) for p in sorted(REPOS_DIR.iterdir()) if (p / "history.json").is_file()}


def discover() -> Tuple[Dict[str, RepoSpec], List[BugSpec]]:
    repos = discover_repos()
    bugs = []
    for repo_dir in sorted(BUGS_DIR.iterdir()) if BUGS_DIR.is_dir() else []:
        if repo_dir.name not in repos:
            raise BuildError(f"bugs/{repo_dir.name}: no such repo under repos/")
        for bug_dir in sorted(repo_dir.iterdir(), key=lambda p: (len(p.name), p.name)):
            if bug_dir.is_dir() and bug_dir.name.isdigit():
                bugs.append(load_bug(repo_dir.name, int(bug_dir.name)))
    return repos, bugs


def tree_files(root: Path) -> Dict[str, bytes]:
    """Every file under *root* (relative posix path -> bytes), caches excluded."""
    files = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if any(part in IGNORED_NAMES for part in rel.parts) or path.suffix in (".pyc", ".pyo"):
            continue
        if path.is_file():
            files[rel.as_posix()] = path.read_bytes()
    return files


# ---------------------------------------------------------------------------
# building


def build_repo(spec: RepoSpec, dest: Path) -> str:
    """Create the shared history of *spec* in *dest*; return the last commit."""
    dest.mkdir(parents=True)
    git(dest, "init", "-q")
    final = tree_files(spec.root / "tree")
    head = ""
    for k, commit in enumerate(spec.commits, start=1):
        for rel in commit.files:
            early = spec.root / "history" / str(k) / rel
            if early.is_file():
                content = early.read_bytes()
            elif rel in final:
                content = final[rel]
            else:
                raise BuildError(f"{spec.name}: commit {k} lists {rel}, which is not in tree/")
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
            git(dest, "add", "--", rel)
        head = commit_all(dest, commit.message, spec.author, spec.commit_date(k))
    built = tree_files(dest)
    if built != final:
        missing = sorted(set(final) - set(built))
        differ = sorted(k for k in set(final) & set(built) if final[k] != built[k])
        raise BuildError(
            f"{spec.name}: the history does not end at tree/ (never committed: {missing}; "
            f"left at an early version: {differ})"
        )
    return head


@dataclass
class Built:
    bug: BugSpec
    record: Dict[str, str]
    bundle: Path
    touched_tests: List[str] = field(default_factory=list)


def build_instance(spec: RepoSpec, repo: Path, shared_head: str, bug: BugSpec, bundle_dir: Path) -> Built:
    """Make the instance's base commit on top of the shared history and bundle it."""
    what = bug.instance_id
    git(repo, "checkout", "-q", "-f", "-B", "main", shared_head)
    git(repo, "clean", "-q", "-fdx")
    apply_diff(repo, bug.base_diff, f"{what}: base.diff")
    when = spec.last_date + timedelta(days=2 * bug.number, hours=3 * bug.number)
    base = commit_all(repo, bug.base_message, spec.author, when)

    bundle = bundle_dir / f"{what}.bundle"
    git(repo, "bundle", "create", "-q", str(bundle), "HEAD", "main")

    patches = {}
    for name, text in (("fix.diff", bug.fix_diff), ("test.diff", bug.test_diff)):
        apply_diff(repo, text, f"{what}: {name}")
        patches[name] = staged_diff(repo)
        git(repo, "reset", "-q", "--hard", base)
        git(repo, "clean", "-q", "-fdx")
    patch, test_patch = patches["fix.diff"], patches["test.diff"]

    patch_paths, test_paths = diff_paths(patch), diff_paths(test_patch)
    if not patch_paths or any(p.startswith("tests/") for p in patch_paths):
        raise BuildError(f"{what}: fix.diff must change non-test files only (touches {patch_paths})")
    if not test_paths or any(not p.startswith("tests/") for p in test_paths):
        raise BuildError(f"{what}: test.diff must change files under tests/ only (touches {test_paths})")
    touched_tests = [p for p in test_paths if p.endswith(".py") and Path(p).name.startswith("test_")]
    if not touched_tests:
        raise BuildError(f"{what}: test.diff touches no test_*.py file")

    created = when + timedelta(days=1, hours=5, minutes=12)
    record = {
        "instance_id": what,
        "repo": f"{REPO_ORG}/{bug.repo}",
        "base_commit": base,
        "patch": patch,
        "test_patch": test_patch,
        "problem_statement": bug.issue,
        "hints_text": "",
        "created_at": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "version": spec.version,
        "FAIL_TO_PASS": "[]",
        "PASS_TO_PASS": "[]",
        "environment_setup_commit": base,
    }
    return Built(bug, record, bundle, touched_tests)


# ---------------------------------------------------------------------------
# verification


def run_pytest(repo: Path, targets: Sequence[str]) -> Tuple[Dict[str, str], str]:
    """Run pytest on *targets*; return ({test id: status}, output)."""
    env = dict(os.environ)
    env.update(PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", PYTHONDONTWRITEBYTECODE="1", PYTHONHASHSEED="0")
    env.pop("PYTEST_ADDOPTS", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", *targets],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=PYTEST_TIMEOUT_S,
    )
    statuses: Dict[str, str] = {}
    for line in proc.stdout.splitlines():
        m = STATUS_RE.match(line)
        if m:
            status, test_id = m.groups()
            # A test reported both PASSED and ERROR (teardown error) counts as failed.
            if statuses.get(test_id, "PASSED") == "PASSED":
                statuses[test_id] = status
    return statuses, proc.stdout + proc.stderr


def verify(built: Built, workdir: Path) -> Dict[str, object]:
    """Check one instance from its bundle and fill in FAIL_TO_PASS / PASS_TO_PASS."""
    rec, what = built.record, built.record["instance_id"]
    started = time.monotonic()
    repo = workdir / "repo"
    git(workdir, "clone", "-q", str(built.bundle), str(repo))
    if git(repo, "rev-parse", "HEAD").strip() != rec["base_commit"]:
        raise BuildError(f"{what}: the bundle's HEAD is not base_commit")
    heads = git(repo, "bundle", "list-heads", str(built.bundle)).split()
    if heads.count(rec["base_commit"]) != 2 or "refs/heads/main" not in heads:
        raise BuildError(f"{what}: bundle heads are {heads}")
    git(repo, "checkout", "-q", rec["base_commit"])

    try:
        git(repo, "apply", "--check", "-", input=rec["patch"])
    except BuildError as exc:
        raise BuildError(f"{what}: gold patch does not apply to base_commit alone: {exc}") from None

    apply_diff(repo, rec["test_patch"], f"{what}: test_patch", index=False)
    before, before_log = run_pytest(repo, built.touched_tests)
    apply_diff(repo, rec["patch"], f"{what}: patch", index=False)
    after, after_log = run_pytest(repo, built.touched_tests)
    full, full_log = run_pytest(repo, [])

    problems = []
    if not after:
        problems.append("no test ran after the gold patch")
    not_passing = {t: s for t, s in after.items() if s != "PASSED"}
    if not_passing:
        problems.append(f"with the gold patch these do not pass: {not_passing}")
    full_not_passing = {t: s for t, s in full.items() if s != "PASSED"}
    if full_not_passing:
        problems.append(f"with the gold patch the full suite has failures: {full_not_passing}")
    vanished = sorted(set(before) - set(after))
    if vanished:
        problems.append(f"tests that ran before but not after: {vanished}")
    f2p = [t for t in after if before.get(t) != "PASSED"]
    p2p = [t for t in after if before.get(t) == "PASSED"]
    if not f2p:
        problems.append("no FAIL_TO_PASS test: the test patch does not expose the bug")
    if len(p2p) < MIN_PASS_TO_PASS:
        problems.append(f"only {len(p2p)} PASS_TO_PASS tests (need {MIN_PASS_TO_PASS}; did a file fail to import?)")
    odd = [t for t in f2p + p2p if not TEST_ID_RE.match(t)]
    if odd:
        problems.append(f"test ids must be plain tests/<file>.py::<function>: {odd}")
    if problems:
        logs = f"--- before (test patch only) ---\n{before_log}\n--- after (test + gold patch) ---\n{after_log}"
        if full_not_passing:
            logs += f"\n--- full suite after ---\n{full_log}"
        raise BuildError(f"{what}: verification failed:\n  - " + "\n  - ".join(problems) + "\n" + logs)

    rec["FAIL_TO_PASS"] = json.dumps(f2p)
    rec["PASS_TO_PASS"] = json.dumps(p2p)
    return {
        "instance_id": what,
        "base": rec["base_commit"][:10],
        "f2p": len(f2p),
        "p2p": len(p2p),
        "full": len(full),
        "seconds": time.monotonic() - started,
        "summary": built.bug.summary,
    }


# ---------------------------------------------------------------------------
# driver


def build_all(out_dir: Path, work: Path, jobs: int) -> List[Dict[str, object]]:
    """Build every instance into out_dir (instances.jsonl + bundles/); verify all."""
    repos, bugs = discover()
    if not bugs:
        raise BuildError("no bug definitions found under bugs/")
    bundle_dir = out_dir / "bundles"
    bundle_dir.mkdir(parents=True, exist_ok=True)

    built: List[Built] = []
    for name, spec in repos.items():
        repo_bugs = [b for b in bugs if b.repo == name]
        if not repo_bugs:
            continue
        repo = work / "src" / name
        head = build_repo(spec, repo)
        for bug in repo_bugs:
            built.append(build_instance(spec, repo, head, bug, bundle_dir))

    rows: List[Dict[str, object]] = []
    errors: List[str] = []

    def task(item: Tuple[int, Built]) -> Dict[str, object]:
        i, b = item
        d = work / "verify" / str(i)
        d.mkdir(parents=True)
        return verify(b, d)

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(task, item): item[1] for item in enumerate(built)}
        for fut in concurrent.futures.as_completed(futures):
            try:
                rows.append(fut.result())
            except BuildError as exc:
                errors.append(str(exc))
            except subprocess.TimeoutExpired as exc:
                errors.append(f"{futures[fut].record['instance_id']}: pytest timed out ({exc})")
    if errors:
        raise BuildError("\n\n".join(sorted(errors)))

    records = sorted((b.record for b in built), key=lambda r: r["instance_id"])
    ids = [r["instance_id"] for r in records]
    if len(set(ids)) != len(ids):
        raise BuildError(f"duplicate instance ids: {ids}")
    with open(out_dir / "instances.jsonl", "w", encoding="utf-8", newline="\n") as fh:
        for rec in records:
            fh.write(json.dumps({k: rec[k] for k in FIELDS}, ensure_ascii=False) + "\n")
    return sorted(rows, key=lambda r: str(r["instance_id"]))


def print_table(rows: List[Dict[str, object]]) -> None:
    width = max(len(str(r["instance_id"])) for r in rows)
    print(f"{'instance':<{width}}  {'base':<10}  F2P  P2P  suite  secs  bug")
    for r in rows:
        print(
            f"{r['instance_id']:<{width}}  {r['base']:<10}  {r['f2p']:>3}  {r['p2p']:>3}  {r['full']:>5}"
            f"  {r['seconds']:4.1f}  {r['summary']}"
        )
    print(f"{len(rows)} instances verified")


def bundle_heads(bundle: Path, cwd: Path) -> List[str]:
    return git(cwd, "bundle", "list-heads", str(bundle)).splitlines()


def compare(committed: Path, fresh: Path) -> List[str]:
    """Differences between the committed outputs and a fresh build."""
    diffs: List[str] = []
    committed_file = committed / "instances.jsonl"
    if not committed_file.is_file():
        return [f"{committed_file} does not exist (run build.py)"]
    old_lines = committed_file.read_text(encoding="utf-8").splitlines()
    new_lines = (fresh / "instances.jsonl").read_text(encoding="utf-8").splitlines()
    try:
        old = {r["instance_id"]: r for r in map(json.loads, old_lines)}
    except (ValueError, KeyError) as exc:
        return [f"{committed_file} does not parse: {exc}"]
    new = {r["instance_id"]: r for r in map(json.loads, new_lines)}
    for iid in sorted(set(old) - set(new)):
        diffs.append(f"{iid}: committed but no longer generated")
    for iid in sorted(set(new) - set(old)):
        diffs.append(f"{iid}: generated but not committed")
    for iid in sorted(set(old) & set(new)):
        for key in sorted(set(old[iid]) | set(new[iid])):
            if old[iid].get(key) != new[iid].get(key):
                diffs.append(f"{iid}: field {key} differs")
    if not diffs and old_lines != new_lines:
        diffs.append("instances.jsonl: same records but different text (order or formatting)")

    probe = fresh / "probe"
    probe.mkdir(exist_ok=True)
    git(probe, "init", "-q")
    committed_bundles = {p.name for p in (committed / "bundles").glob("*.bundle")}
    for iid, rec in sorted(new.items()):
        name = f"{iid}.bundle"
        path = committed / "bundles" / name
        if name not in committed_bundles:
            diffs.append(f"{iid}: bundle {path} missing")
            continue
        try:
            heads = bundle_heads(path, probe)
            git(probe, "bundle", "verify", "-q", str(path))
        except BuildError as exc:
            diffs.append(f"{iid}: bad bundle: {exc}")
            continue
        expected = sorted([f"{rec['base_commit']} HEAD", f"{rec['base_commit']} refs/heads/main"])
        if sorted(heads) != expected:
            diffs.append(f"{iid}: committed bundle heads {heads}, expected {expected}")
    for name in sorted(committed_bundles - {f"{iid}.bundle" for iid in new}):
        diffs.append(f"bundles/{name}: stale bundle (no such instance)")
    return diffs


def scratch(ident: str, dest: Path) -> None:
    """Check out a repo's shared history, or an instance's base commit, into *dest*."""
    ident = ident[len(ID_PREFIX):] if ident.startswith(ID_PREFIX) else ident
    repos = discover_repos()
    name, _, number = ident.rpartition("-") if ident not in repos else (ident, "", "")
    if name not in repos:
        raise BuildError(f"unknown repo or instance: {ident}")
    if dest.exists() and any(dest.iterdir()):
        raise BuildError(f"{dest} is not empty")
    with tempfile.TemporaryDirectory(prefix="swe-mini-") as tmp:
        repo = Path(tmp) / name
        head = build_repo(repos[name], repo)
        if number:
            bug = load_bug(name, int(number))
            built = build_instance(repos[name], repo, head, bug, Path(tmp))
            head = built.record["base_commit"]
        git(Path(tmp), "clone", "-q", str(repo), str(dest))
        git(dest, "checkout", "-q", "-B", "main", head)
    print(f"{dest}: {name} at {head}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="verify the committed outputs are up to date")
    mode.add_argument("--scratch", nargs=2, metavar=("ID", "DIR"), help="check out a repo/instance for authoring")
    parser.add_argument("-j", "--jobs", type=int, default=max(2, os.cpu_count() or 2), help="parallel verifications")
    args = parser.parse_args(argv)

    started = time.monotonic()
    try:
        if args.scratch:
            scratch(args.scratch[0], Path(args.scratch[1]).resolve())
            return 0
        with tempfile.TemporaryDirectory(prefix="swe-mini-") as tmp:
            work = Path(tmp)
            fresh = work / "out"
            rows = build_all(fresh, work, args.jobs)
            print_table(rows)
            if args.check:
                diffs = compare(OUT_DIR, fresh)
                if diffs:
                    print("swe-mini outputs are out of date (run scripts/swe_mini/build.py):", file=sys.stderr)
                    for d in diffs:
                        print(f"  - {d}", file=sys.stderr)
                    return 1
                print(f"--check: committed outputs match ({time.monotonic() - started:.1f} s)")
                return 0
            bundles = OUT_DIR / "bundles"
            bundles.mkdir(parents=True, exist_ok=True)
            for old in bundles.glob("*.bundle"):
                old.unlink()
            for new_bundle in sorted((fresh / "bundles").glob("*.bundle")):
                shutil.copyfile(new_bundle, bundles / new_bundle.name)
            shutil.copyfile(fresh / "instances.jsonl", OUT_DIR / "instances.jsonl")
            print(f"wrote {OUT_DIR.relative_to(ROOT)} ({time.monotonic() - started:.1f} s)")
            return 0
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
