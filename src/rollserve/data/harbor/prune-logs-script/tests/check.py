"""Runs the agent's prune.sh (the working directory's) on folders made here, with
modification times drawn now, and compares what it deletes, keeps and prints with
what the task asks. Exit 0: every case holds."""

import os
import random
import shutil
import subprocess
import sys
import tempfile

SCRIPT = os.path.abspath("prune.sh")
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": tempfile.gettempdir()}
LOGS = ["app.log", "app 1.log", "db.log", "worker.log", "x.log", "zz top.log", "a.log"]
OTHERS = ["notes.txt", "log", "app.log.1", "readme.LOG"]


def run(*args):
    return subprocess.run([SCRIPT, *args], capture_output=True, text=True, timeout=30, env=ENV)


def listing(folder):
    found = set()
    for base, dirs, files in os.walk(folder):
        for name in dirs + files:
            found.add(os.path.relpath(os.path.join(base, name), folder))
    return found


def make_folder(root, rng, count):
    folder = os.path.join(root, f"case {rng.randint(0, 10**6)}")
    os.makedirs(os.path.join(folder, "sub"))
    os.makedirs(os.path.join(folder, "dir.log"))  # a folder named like a log
    names = rng.sample(LOGS, count)
    stamps = rng.sample(range(1_700_000_000, 1_700_900_000, 600), count + 3)
    for name, stamp in zip(names + OTHERS[:3], stamps):
        path = os.path.join(folder, name)
        with open(path, "w") as f:
            f.write(name + "\n")
        os.utime(path, (stamp, stamp))
    old = os.path.join(folder, "sub", "ancient.log")
    with open(old, "w") as f:
        f.write("old\n")
    os.utime(old, (1_600_000_000, 1_600_000_000))
    os.symlink(names[0], os.path.join(folder, "link.log"))  # a link: not considered
    by_age = sorted(names, key=lambda n: os.stat(os.path.join(folder, n)).st_mtime)
    return folder, by_age


def check(root):
    if not os.path.isfile(SCRIPT) or not os.access(SCRIPT, os.X_OK):
        raise AssertionError("no executable prune.sh")
    rng = random.Random()
    for count, keep in ((6, 2), (4, 0), (3, 5), (5, 4)):
        folder, by_age = make_folder(root, rng, count)
        before = listing(folder)
        done = run(folder, str(keep))
        deleted = by_age[:max(0, count - keep)]
        if done.returncode != 0:
            raise AssertionError(f"exit {done.returncode} for KEEP={keep}: {done.stderr[-300:]}")
        if done.stdout.splitlines() != deleted:
            raise AssertionError(f"KEEP={keep}: printed {done.stdout.splitlines()}, expected {deleted}")
        if listing(folder) != before - set(deleted):
            raise AssertionError(f"KEEP={keep}: left {sorted(listing(folder))}, expected "
                                 f"{sorted(before - set(deleted))}")
    folder, _ = make_folder(root, rng, 3)
    before = listing(folder)
    for args in ([], [folder], [folder, "1", "2"], [folder, "-1"], [folder, "two"], [folder, "1.5"],
                 [folder, ""], [os.path.join(folder, "missing"), "1"], [os.path.join(folder, "notes.txt"), "1"]):
        done = run(*args)
        if done.returncode != 2 or not done.stderr.strip() or listing(folder) != before:
            raise AssertionError(f"wrong usage {args[1:] if args else []} was not refused "
                                 f"(exit {done.returncode})")


root = tempfile.mkdtemp(prefix="verify-prune-")
try:
    check(root)
except (AssertionError, OSError, subprocess.SubprocessError) as error:
    print(f"FAIL: {error}")
    sys.exit(1)
finally:
    shutil.rmtree(root, ignore_errors=True)
print("all cases passed")
