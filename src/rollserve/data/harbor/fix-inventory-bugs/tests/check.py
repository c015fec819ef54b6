"""Runs probe.py on the agent's library in a process of its own and compares every
outcome with the ones kept beside this file (expected.json). Exit 0: all equal.

The expected outcomes are read, then removed from disk, before any of the agent's code
runs: a library that reads them at import could otherwise print them back."""

import json
import os
import subprocess
import sys

TESTS = sys.argv[1]
with open(os.path.join(TESTS, "scenarios.json")) as f:
    scenarios = f.read()
with open(os.path.join(TESTS, "expected.json")) as f:
    expected = json.load(f)
with open(os.path.join(TESTS, "probe.py")) as f:
    probe = f.read()
for name in ("expected.json", "scenarios.json", "probe.py"):
    try:
        os.remove(os.path.join(TESTS, name))
    except OSError:
        pass  # (a read-only copy of the tests: nothing more to do)
try:
    done = subprocess.run([sys.executable, "-I", "-c", probe, os.getcwd()],
                          input=scenarios, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
    got = json.loads(done.stdout.strip().splitlines()[-1])
except (subprocess.SubprocessError, ValueError, IndexError) as error:
    print(f"FAIL: the library could not be run: {error}")
    sys.exit(1)
wrong = 0
for number, (want, have) in enumerate(zip(expected, got + [None] * len(expected)), 1):
    if want != have:
        wrong += 1
        print(f"scenario {number}: expected {want}, got {have}")
sys.exit(1 if wrong or len(got) != len(expected) else 0)
