"""Write constraints.txt: the exact versions CI installs, read from a venv that works.

Run it with the venv's python, after ``pip install -e '.[local,dev]'`` there and the
tests passing::

    .venv/bin/python scripts/constraints.py > constraints.txt

The trainer's venv for verl cannot take constraints.txt (it pins the server's
transformers, which verl 0.9 refuses); its file is made the same way from the venv that
tests/integrations/test_verl_loop.py builds (torch left out: each trainer picks its
build)::

    VENV/bin/python scripts/constraints.py verl > constraints-verl.txt

It follows rollserve's requirements (with the extras named on the command line;
default: every extra that is installed) through the installed distributions'
metadata and prints ``name==version`` for each distribution reached, rollserve itself
left out. Packages of the venv that no extra pulls in (a tool installed by hand) are
not listed.
"""

from __future__ import annotations

import sys
from importlib import metadata

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = "rollserve"
TOOLS = {"pip"}  # the venv's own installer, not a dependency to pin
DEFAULT_EXTRAS = ("server", "local", "dev", "swe")
# Extras whose file leaves packages out: the trainer installs its own torch (CUDA or CPU).
LEFT_OUT = {"verl": {"torch"}}


def _wanted(marker: Marker | None, extra: str) -> bool:
    return marker is None or marker.evaluate({"extra": extra})


def closure(extras: tuple[str, ...]) -> dict[str, str]:
    """Every installed distribution reached from rollserve[extras]: name -> version."""
    found: dict[str, str] = {}
    todo: list[tuple[str, tuple[str, ...]]] = [(ROOT, extras)]
    seen: set[tuple[str, str]] = set()
    while todo:
        name, wanted_extras = todo.pop()
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            print(f"# not installed, left out: {name}", file=sys.stderr)
            continue
        key = canonicalize_name(dist.metadata["Name"])
        if key != ROOT and key not in TOOLS:
            found[key] = dist.version
        for extra in ("", *wanted_extras):
            if (key, extra) in seen:
                continue
            seen.add((key, extra))
            for line in dist.requires or []:
                req = Requirement(line)
                if _wanted(req.marker, extra):
                    todo.append((req.name, tuple(sorted(req.extras))))
    return found


def main(argv: list[str]) -> None:
    extras = tuple(argv) or DEFAULT_EXTRAS
    name = "constraints.txt" if extras == DEFAULT_EXTRAS else f"constraints-{'-'.join(extras)}.txt"
    left_out = set().union(*(LEFT_OUT.get(extra, set()) for extra in extras))
    print(f"# Exact versions CI installs (-c {name}): rollserve[{','.join(extras)}]'s")
    print("# dependencies as installed in a venv whose tests pass. Regenerate with")
    if extras == DEFAULT_EXTRAS:
        print("#   .venv/bin/python scripts/constraints.py > constraints.txt")
    else:
        print(f"#   VENV/bin/python scripts/constraints.py {' '.join(extras)} > {name}")
    if left_out:
        print(f"# Left out (the trainer installs its own): {', '.join(sorted(left_out))}")
    for dist, version in sorted(closure(extras).items()):
        if dist not in left_out:
            # A local label is left out (torch 2.13.0+cpu: ``torch==2.13.0``): the pin then
            # matches the CPU wheel of the machine's wheel folder, which pip prefers (a
            # local label sorts higher), and is a version an index can still answer.
            print(f"{dist}=={version.split('+')[0]}")


if __name__ == "__main__":
    main(sys.argv[1:])
