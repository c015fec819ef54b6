"""Checks the working directory's sorted/ against the manifest kept beside this file
(expected.json: each file's place and contents' sha256), and that inbox/ is gone.
Exit 0: all hold."""

import hashlib
import json
import os
import stat
import sys

with open(os.path.join(sys.argv[1], "expected.json")) as f:
    expected = json.load(f)
failures = []
if os.path.lexists("inbox"):
    failures.append("inbox/ is still there")
if os.path.islink("sorted") or not os.path.isdir("sorted"):
    failures.append("sorted/ is not a folder")
else:
    found = {}
    for base, dirs, files in os.walk("sorted"):
        for name in dirs + files:
            path = os.path.join(base, name)
            relative = os.path.relpath(path, "sorted")
            info = os.lstat(path)
            if stat.S_ISDIR(info.st_mode) and os.sep not in relative:
                continue  # a category
            if not stat.S_ISREG(info.st_mode):
                failures.append(f"sorted/{relative} is not a regular file")
                continue
            with open(path, "rb") as f:
                found[relative] = hashlib.sha256(f.read()).hexdigest()
    for path in sorted(set(found) | set(expected)):
        if found.get(path) != expected.get(path):
            what = "missing" if path not in found else "unexpected" if path not in expected else "wrong contents"
            failures.append(f"sorted/{path}: {what}")
for failure in failures:
    print(f"FAIL: {failure}")
sys.exit(1 if failures else 0)
