"""Runs the agent's Makefile (the working directory's) on a fresh copy of the pristine
sources kept beside this file, in a folder of its own, and checks what the task asks:
separate objects, a working program (on inputs drawn now), nothing rebuilt needlessly,
exactly the dependants of a changed header rebuilt, and `make clean`. Exit 0: all hold."""

import os
import random
import shutil
import subprocess
import sys
import tempfile

TESTS = sys.argv[1]
OBJECTS = ("main", "parse", "stats")
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": tempfile.gettempdir()}
failures = []


def make(root, *args):
    done = subprocess.run(["make", "-C", root, *args], env=ENV, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise AssertionError(f"make {' '.join(args)} failed: {(done.stdout + done.stderr)[-1500:]}")


def mtimes(root):
    found = {}
    for folder in ("build", "bin"):
        for base, _dirs, files in os.walk(os.path.join(root, folder)):
            for name in files:
                path = os.path.join(base, name)
                found[os.path.relpath(path, root)] = os.stat(path).st_mtime_ns
    return found


def age(root):
    """Sources oldest, then objects, then the program: an up-to-date build, in the past."""
    for base, _dirs, files in os.walk(os.path.join(root, "src")):
        for name in files:
            os.utime(os.path.join(base, name), (1_600_000_000, 1_600_000_000))
    for base, _dirs, files in os.walk(os.path.join(root, "build")):
        for name in files:
            os.utime(os.path.join(base, name), (1_600_000_100, 1_600_000_100))
    os.utime(os.path.join(root, "bin", "stats"), (1_600_000_200, 1_600_000_200))


def expected_output(numbers):
    lines = [f"count={len(numbers)}"]
    if numbers:
        total = 0.0
        for n in numbers:
            total += n
        lines += [f"min={min(numbers):.3f}", f"max={max(numbers):.3f}", f"mean={total / len(numbers):.3f}"]
    return "\n".join(lines) + "\n"


def rebuilt_after_touching(root, source):
    age(root)
    before = mtimes(root)
    os.utime(os.path.join(root, "src", source))  # now
    make(root)
    after = mtimes(root)
    return {path for path in before if after.get(path) != before[path]} | (set(after) - set(before))


def build_and_run(root):
    """The first build: separate objects, and a program that answers right."""
    if not os.path.isfile("Makefile") or os.path.islink("Makefile"):
        raise AssertionError("no Makefile (a regular file) in the working directory")
    shutil.copy("Makefile", os.path.join(root, "Makefile"))
    shutil.copytree(os.path.join(TESTS, "src"), os.path.join(root, "src"))
    make(root)
    for name in OBJECTS:
        with open(os.path.join(root, "build", name + ".o"), "rb") as f:
            head = f.read(18)
        if head[:4] != b"\x7fELF" or int.from_bytes(head[16:18], "little") != 1:
            raise AssertionError(f"build/{name}.o is not a relocatable object")
    rng = random.Random()
    for numbers in ([], [rng.randint(-500, 500) for _ in range(rng.randint(1, 40))],
                    [rng.randint(0, 10**6) for _ in range(rng.randint(100, 300))]):
        text = " ".join(map(str, numbers)) + "\n"
        done = subprocess.run([os.path.join(root, "bin", "stats")], input=text, capture_output=True,
                              text=True, timeout=30, env=ENV)
        if done.stdout != expected_output(numbers):
            raise AssertionError(f"bin/stats printed {done.stdout!r} for {len(numbers)} numbers")


def rebuilds(root):
    """Nothing rebuilt needlessly; exactly the dependants of a change rebuilt; clean."""
    before = mtimes(root)
    make(root)
    if mtimes(root) != before:
        raise AssertionError("a second make rebuilt something")
    wanted = {"parse.c": {"build/parse.o", "bin/stats"},
              "stats.h": {"build/main.o", "build/stats.o", "bin/stats"},
              "parse.h": {"build/main.o", "build/parse.o", "bin/stats"}}
    for source, expected in wanted.items():
        rebuilt = {path for path in rebuilt_after_touching(root, source) if path.endswith((".o", "stats"))}
        if rebuilt != expected:
            raise AssertionError(f"after a change to src/{source}, rebuilt {sorted(rebuilt)}, "
                                 f"expected {sorted(expected)}")
    make(root, "clean")
    if os.path.exists(os.path.join(root, "build")) or os.path.exists(os.path.join(root, "bin")):
        raise AssertionError("make clean left build/ or bin/")
    make(root)
    if not os.access(os.path.join(root, "bin", "stats"), os.X_OK):
        raise AssertionError("make after make clean did not build bin/stats")


root = tempfile.mkdtemp(prefix="verify-make-")
try:
    build_and_run(root)
    rebuilds(root)
except (AssertionError, OSError, subprocess.SubprocessError) as error:
    print(f"FAIL: {error}")
    sys.exit(1)
finally:
    shutil.rmtree(root, ignore_errors=True)
print("all checks passed")
