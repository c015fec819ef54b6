"""Regenerate the committed npm lockfiles of the harness presets
(``src/rollserve/agent/harnesses/locks/<name>/``), complete for ``npm ci``.

    python scripts/harness_locks.py [NAME ...]

For each preset's ``package.json`` (one dependency, an exact version): ``npm install
--package-lock-only``, then every optional per-platform package the lockfile leaves
out is added to it (npm 11 writes only the ones for this machine's platform, and
``npm ci`` then refuses the lockfile as out of sync with package.json): its version,
tarball, integrity, os/cpu/libc, asked of the registry with ``npm view`` (one the
registry does not have is dropped from its parent's optionalDependencies, said). ``npm ci``
installs only the entries that fit the machine it runs on (linux-x64 here). Needs
the npm registry.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

LOCKS = Path(__file__).resolve().parents[1] / "src" / "rollserve" / "agent" / "harnesses" / "locks"


def npm(*args: str, cwd: Path, missing_ok: bool = False) -> str | None:
    done = subprocess.run(["npm", *args], cwd=cwd, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        if missing_ok and "E404" in done.stderr:
            return None
        sys.exit(f"npm {' '.join(args)} failed in {cwd}: {done.stderr[-2000:]}")
    return done.stdout


def entry(name: str, spec: str, cwd: Path) -> dict | None:
    """The lockfile entry of ``name@spec`` (an optional platform package); None where
    the registry does not have it."""
    text = npm("view", f"{name}@{spec}", "--json", cwd=cwd, missing_ok=True)
    if text is None:
        return None
    info = json.loads(text)
    info = info[-1] if isinstance(info, list) else info
    found = {"version": info["version"], "resolved": info["dist"]["tarball"],
             "integrity": info["dist"]["integrity"], "optional": True}
    for key in ("cpu", "os", "libc", "license", "engines", "bin"):
        if info.get(key):
            found[key] = info[key]
    return found


def complete(folder: Path) -> int:
    """Add the optional packages the lockfile lacks; how many were added."""
    path = folder / "package-lock.json"
    lock = json.loads(path.read_text())
    packages = lock["packages"]
    added = 0
    for where, package in list(packages.items()):
        for name, spec in list((package.get("optionalDependencies") or {}).items()):
            nested = f"{where}/node_modules/{name}" if where else f"node_modules/{name}"
            if nested in packages or f"node_modules/{name}" in packages:
                continue
            found = entry(name, spec, folder)
            if found is None:  # not in the registry we can reach: dropped, said
                print(f"{folder.name}: {name}@{spec} is not in the registry; left out of the lockfile")
                del package["optionalDependencies"][name]
                continue
            packages[f"node_modules/{name}"] = found
            added += 1
    lock["packages"] = {"": packages[""], **dict(sorted((k, v) for k, v in packages.items() if k))}
    path.write_text(json.dumps(lock, indent=2) + "\n")
    return added


def main(names: list[str]) -> None:
    for folder in sorted(LOCKS.iterdir()):
        if names and folder.name not in names:
            continue
        (folder / "package-lock.json").unlink(missing_ok=True)
        npm("install", "--package-lock-only", "--ignore-scripts", "--no-audit", "--no-fund", cwd=folder)
        print(f"{folder.name}: lockfile written, {complete(folder)} optional platform packages added")


if __name__ == "__main__":
    main(sys.argv[1:])
