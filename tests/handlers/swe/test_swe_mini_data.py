"""The bundled swe-mini suite (src/rollserve/data/swe_mini): format and integrity.

Fast checks of instances.jsonl and the git bundles, plus one run of
``scripts/swe_mini/build.py --check``, which rebuilds and re-verifies every
instance in a temp dir and compares with the committed outputs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "src" / "rollserve" / "data" / "swe_mini"
BUILD = ROOT / "scripts" / "swe_mini" / "build.py"

FIELDS = {
    "instance_id": str,
    "repo": str,
    "base_commit": str,
    "patch": str,
    "test_patch": str,
    "problem_statement": str,
    "hints_text": str,
    "created_at": str,
    "version": str,
    "FAIL_TO_PASS": str,
    "PASS_TO_PASS": str,
    "environment_setup_commit": str,
}
ID_RE = re.compile(r"^rollserve-mini__([a-z][a-z0-9_]*)-([1-9][0-9]*)$")
SHA_RE = re.compile(r"^[0-9a-f]{40}$")
TEST_ID_RE = re.compile(r"^tests/[A-Za-z0-9_/]+\.py::[A-Za-z_][A-Za-z0-9_]*$")

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def git(cwd: Path, *args: str, input: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull)
    return subprocess.run(
        ["git", "-c", "init.defaultBranch=main", *args],
        cwd=cwd,
        env=env,
        input=input,
        capture_output=True,
        text=True,
    )


def touched(diff: str) -> list[str]:
    return re.findall(r"^diff --git a/\S+ b/(\S+)$", diff, flags=re.M)


def load_instances() -> list[dict]:
    lines = (DATA / "instances.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


INSTANCES = load_instances()
IDS = [inst["instance_id"] for inst in INSTANCES]


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> Path:
    """An empty repository (git bundle verify needs one)."""
    path = tmp_path_factory.mktemp("probe")
    assert git(path, "init", "-q").returncode == 0
    return path


def test_instances_parse_and_count():
    assert len(INSTANCES) >= 12
    assert len(set(IDS)) == len(IDS)
    assert IDS == sorted(IDS)


@pytest.mark.parametrize("inst", INSTANCES, ids=IDS)
def test_fields_and_types(inst):
    assert set(inst) == set(FIELDS)
    for key, typ in FIELDS.items():
        assert isinstance(inst[key], typ), key
    m = ID_RE.match(inst["instance_id"])
    assert m, inst["instance_id"]
    assert inst["repo"] == f"rollserve-mini/{m.group(1)}"
    assert SHA_RE.match(inst["base_commit"])
    assert inst["environment_setup_commit"] == inst["base_commit"]
    assert inst["hints_text"] == ""
    datetime.strptime(inst["created_at"], "%Y-%m-%dT%H:%M:%SZ")
    assert re.match(r"^\d+\.\d+$", inst["version"])
    title, _, body = inst["problem_statement"].partition("\n")
    assert title.strip() and len(body.strip()) > 100


@pytest.mark.parametrize("inst", INSTANCES, ids=IDS)
def test_test_lists(inst):
    f2p = json.loads(inst["FAIL_TO_PASS"])
    p2p = json.loads(inst["PASS_TO_PASS"])
    assert isinstance(f2p, list) and isinstance(p2p, list)
    assert f2p and len(p2p) >= 3
    assert not set(f2p) & set(p2p)
    assert len(set(f2p)) == len(f2p) and len(set(p2p)) == len(p2p)
    test_files = set(touched(inst["test_patch"]))
    for test_id in f2p + p2p:
        assert TEST_ID_RE.match(test_id), test_id
        assert test_id.split("::")[0] in test_files, test_id


@pytest.mark.parametrize("inst", INSTANCES, ids=IDS)
def test_patches_split_source_and_tests(inst):
    patch_files = touched(inst["patch"])
    test_files = touched(inst["test_patch"])
    assert patch_files and test_files
    assert not [p for p in patch_files if p.startswith("tests/")]
    assert all(p.startswith("tests/") for p in test_files)
    for diff in (inst["patch"], inst["test_patch"]):
        assert "\n--- a/" in diff or "\n--- /dev/null" in diff
        assert "\n+++ b/" in diff


@pytest.mark.parametrize("inst", INSTANCES, ids=IDS)
def test_bundle(inst, probe, tmp_path):
    bundle = DATA / "bundles" / f"{inst['instance_id']}.bundle"
    assert bundle.is_file()
    verify = git(probe, "bundle", "verify", str(bundle))
    assert verify.returncode == 0, verify.stderr
    heads = git(probe, "bundle", "list-heads", str(bundle))
    assert heads.returncode == 0, heads.stderr
    refs = dict(reversed(line.split()) for line in heads.stdout.splitlines())
    assert refs.get("refs/heads/main") == inst["base_commit"]

    clone = tmp_path / "repo"
    cloned = git(tmp_path, "clone", "-q", str(bundle), str(clone))
    assert cloned.returncode == 0, cloned.stderr
    assert git(clone, "rev-parse", "HEAD").stdout.strip() == inst["base_commit"]
    # Both patches apply to base_commit, i.e. neither is in it already ...
    for key in ("patch", "test_patch"):
        check = git(clone, "apply", "--check", "-", input=inst[key])
        assert check.returncode == 0, f"{key}: {check.stderr}"
    # ... and no fixed file version exists anywhere in the bundle's history.
    for post_image in re.findall(r"^index [0-9a-f]+\.\.([0-9a-f]+)", inst["patch"], flags=re.M):
        assert git(clone, "cat-file", "-e", f"{post_image}^{{blob}}").returncode != 0, post_image


def test_no_stale_bundles():
    bundles = {p.name for p in (DATA / "bundles").glob("*.bundle")}
    assert bundles == {f"{iid}.bundle" for iid in IDS}


@pytest.mark.timeout(240)
def test_build_check_is_up_to_date():
    """Rebuilds the suite from scripts/swe_mini and re-verifies every instance."""
    proc = subprocess.run(
        [sys.executable, str(BUILD), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=230,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
