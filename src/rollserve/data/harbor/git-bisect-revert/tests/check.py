"""Checks the answer and the repository against the hashes kept beside this file
(expected.json: the history's hashes are fixed by the stream). Exit 0: all hold.
git runs without system or global configuration, with hooks and fsmonitor turned off,
and only reads refs and objects (rev-parse, rev-list): nothing the agent configured in
the repository runs here."""

import json
import os
import subprocess
import sys

with open(os.path.join(sys.argv[1], "expected.json")) as f:
    expected = json.load(f)
ENV = {"PATH": "/usr/bin:/bin", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null",
       "HOME": "/nonexistent", "LANG": "C.UTF-8"}
SAFE = ["-c", "safe.directory=*", "-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null"]


def git(*args):
    done = subprocess.run(["git", *SAFE, "-C", "repo", *args], capture_output=True, text=True,
                          timeout=30, env=ENV)
    return done.stdout.strip() if done.returncode == 0 else None


failures = []
if os.path.islink("culprit.txt") or not os.path.isfile("culprit.txt"):
    failures.append("no culprit.txt")
else:
    with open("culprit.txt") as f:
        answer = f.read().strip()
    if answer != expected["culprit"]:
        failures.append(f"culprit.txt says {answer[:60]!r}")
if os.path.islink("repo") or not os.path.isdir("repo"):
    failures.append("no repository at repo/")
else:
    if git("rev-parse", "--verify", "-q", "refs/heads/main^{commit}") != expected["main"]:
        failures.append("main is not the history's tip")
    if git("rev-parse", "--verify", "-q", "refs/heads/fix~1^{commit}") != expected["main"]:
        failures.append("fix is not one commit on top of main")
    elif git("rev-list", "--count", "refs/heads/main..refs/heads/fix") != "1":
        failures.append("fix holds more than one new commit")
    if git("rev-parse", "--verify", "-q", "refs/heads/fix^{tree}") != expected["fix_tree"]:
        failures.append("fix's files are not main's with the culprit reverted")
for failure in failures:
    print(f"FAIL: {failure}")
sys.exit(1 if failures else 0)
