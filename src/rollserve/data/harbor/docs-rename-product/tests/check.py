"""Compares every file of the working directory's docs/ with the texts kept beside this
file (expected.json: path -> the renamed text). Exit 0: the same files, the same bytes."""

import json
import os
import stat
import sys

with open(os.path.join(sys.argv[1], "expected.json")) as f:
    expected = json.load(f)
failures = []
found = {}
if os.path.islink("docs") or not os.path.isdir("docs"):
    failures.append("docs/ is not a folder")
else:
    for base, _dirs, files in os.walk("docs"):
        for name in files:
            path = os.path.join(base, name)
            if not stat.S_ISREG(os.lstat(path).st_mode):
                failures.append(f"{path} is not a regular file")
                continue
            with open(path, encoding="utf-8", errors="replace", newline="") as f:
                found[path] = f.read()
    for path in sorted(set(found) | set(expected)):
        if found.get(path) != expected.get(path):
            what = "missing" if path not in found else "unexpected" if path not in expected else "differs"
            failures.append(f"{path}: {what}")
for failure in failures:
    print(f"FAIL: {failure}")
sys.exit(1 if failures else 0)
