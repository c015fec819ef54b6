"""Stand-in ``apptainer`` and ``docker`` executables for image-pull tests, placed
first on PATH; each logs its calls to calls.jsonl next to it."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

# `build OUT REF`: logs the call with its start and end times to calls.jsonl, sleeps
# FAKE_BUILD_SECONDS, then writes OUT. A REF containing "fail" always fails; one
# containing "flaky" fails its first FAKE_FAILS builds (counted in a file per REF).
FAKE_APPTAINER = """#!PYTHON
import hashlib, json, os, sys, time
here = os.path.dirname(os.path.abspath(__file__))
args = sys.argv[1:]
started = time.time()
def log(ok):
    with open(os.path.join(here, "calls.jsonl"), "a") as f:
        f.write(json.dumps({"argv": args, "start": started, "end": time.time(), "ok": ok}) + "\\n")
if args[0] != "build":
    sys.exit(2)
out, ref = args[1], args[2]
time.sleep(float(os.environ.get("FAKE_BUILD_SECONDS", "0.05")))
counter = os.path.join(here, "fails-" + hashlib.sha256(ref.encode()).hexdigest()[:8])
failed = int(open(counter).read()) if os.path.exists(counter) else 0
if "fail" in ref or ("flaky" in ref and failed < int(os.environ.get("FAKE_FAILS", "1"))):
    open(counter, "w").write(str(failed + 1))
    log(False); print("FATAL: unable to pull " + ref, file=sys.stderr); sys.exit(255)
open(out, "w").write("SIF " + ref)
log(True)
"""

# `image inspect REF`: 0 if REF was pulled (listed in have.txt); `pull REF` adds it.
FAKE_DOCKER = """#!PYTHON
import json, os, sys
here = os.path.dirname(os.path.abspath(__file__))
have = os.path.join(here, "have.txt")
pulled = open(have).read().split() if os.path.exists(have) else []
args = sys.argv[1:]
with open(os.path.join(here, "calls.jsonl"), "a") as f:
    f.write(json.dumps({"argv": args}) + "\\n")
if args[:2] == ["image", "inspect"]:
    sys.exit(0 if args[2] in pulled else 1)
if args[0] == "pull":
    if "fail" in args[1]:
        print("Error response from daemon: manifest unknown", file=sys.stderr); sys.exit(1)
    open(have, "a").write(args[1] + "\\n"); sys.exit(0)
sys.exit(2)
"""


class FakeBinary:
    def __init__(self, folder: Path, name: str, source: str):
        self.folder = folder
        script = folder / name
        script.write_text(source.replace("PYTHON", sys.executable))
        script.chmod(script.stat().st_mode | stat.S_IEXEC)

    def calls(self, kind: str | None = None) -> list[dict]:
        log = self.folder / "calls.jsonl"
        entries = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        return [e for e in entries if kind is None or e["argv"][0] == kind]


def install(tmp_path: Path, monkeypatch, name: str, source: str) -> FakeBinary:
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    return FakeBinary(folder, name, source)
