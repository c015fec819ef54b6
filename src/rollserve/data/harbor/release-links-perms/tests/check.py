"""Checks the working directory's releases/, current and config.ini against the
manifest kept beside this file (expected.json: which releases stay, each file's
contents and mode). Exit 0: all hold."""

import hashlib
import json
import os
import stat
import sys

with open(os.path.join(sys.argv[1], "expected.json")) as f:
    expected = json.load(f)
newest = expected["newest"]


def walk(version, problems):
    """Each file of a release: its contents' sha256 and mode; a wrong folder mode or a
    file that is not regular goes to ``problems``."""
    found = {}
    for base, dirs, files in os.walk(os.path.join("releases", version)):
        for name in dirs:
            mode = stat.S_IMODE(os.lstat(os.path.join(base, name)).st_mode)
            if mode != 0o755:
                problems.append(f"folder {os.path.join(base, name)} has mode {mode:o}")
        for name in files:
            path = os.path.join(base, name)
            info = os.lstat(path)
            if not stat.S_ISREG(info.st_mode):
                problems.append(f"{path} is not a regular file")
                continue
            with open(path, "rb") as f:
                found[os.path.relpath(path, "releases")] = {
                    "sha256": hashlib.sha256(f.read()).hexdigest(), "mode": stat.S_IMODE(info.st_mode)}
    return found


def releases():
    if os.path.islink("releases") or not os.path.isdir("releases"):
        return ["releases/ is not a folder"]
    problems = []
    if sorted(os.listdir("releases")) != sorted(expected["kept"]):
        problems.append(f"releases/ holds {sorted(os.listdir('releases'))}")
    found = {}
    for version in expected["kept"]:
        found.update(walk(version, problems))
    for path in sorted(set(found) | set(expected["files"])):
        if found.get(path) != expected["files"].get(path):
            problems.append(f"{path}: {found.get(path)}, expected {expected['files'].get(path)}")
    return problems


def links():
    problems = []
    target = os.readlink("current") if os.path.islink("current") else None
    if target is None:
        problems.append("current is not a symbolic link")
    elif target.startswith("/") or os.path.realpath("current") != os.path.realpath(os.path.join("releases", newest)):
        problems.append(f"current points to {target!r}")
    if os.path.islink("config.ini") or not os.path.isfile("config.ini"):
        problems.append("config.ini is not a regular file")
    elif os.path.isfile(os.path.join("releases", newest, "config.ini")):
        link, original = os.stat("config.ini"), os.stat(os.path.join("releases", newest, "config.ini"))
        if (link.st_dev, link.st_ino) != (original.st_dev, original.st_ino):
            problems.append("config.ini is not a hard link to the newest release's config.ini")
    return problems


failures = releases() + links()
for failure in failures:
    print(f"FAIL: {failure}")
sys.exit(1 if failures else 0)
