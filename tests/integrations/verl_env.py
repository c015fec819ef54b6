"""The venv with ``rollserve[verl]`` that tests/integrations/test_verl_loop.py runs
verl in (the client and verl 0.9, CPU torch; ``-c constraints-verl.txt``: not
constraints.txt, which pins the server's transformers >= 5.18 that verl 0.9 refuses).

Built once and kept under the rollserve cache (``verl-venv-<key>``: a hash of what the
install asks for, the constraints included); a build that did not finish is redone; a
second process wanting it waits on its lock. Run as a script (``python
tests/integrations/verl_env.py``) it builds the venv ahead of the tests: CI starts it
in the background, as the download takes minutes.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TORCH = "torch==2.13.0"  # the CPU build (this machine's wheel folder; CI's index has it too)
BUILD_TIMEOUT_S = 1800  # measured: 3 to 9 min on a loaded 2-core host, most of it downloads
REINSTALL_TIMEOUT_S = 600
CONSTRAINTS = "constraints-verl.txt"  # not constraints.txt: scripts/constraints.py says why


def extra() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return list(project["optional-dependencies"]["verl"])


def source_copy(tmp: Path) -> Path:
    """A copy of the package's sources (pip builds in the source tree)."""
    source = tmp / "rollserve"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", CONSTRAINTS):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc"))
    return source


def pip(python: Path, *args: str, timeout: float) -> None:
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise RuntimeError(f"pip install failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")


def _remove_stale(current: Path) -> None:
    """Remove the venvs of other keys (about 2 GB each) that no session is using."""
    for other in current.parent.glob("verl-venv-*"):
        if other == current or not other.is_dir():
            continue
        with open(other.parent / f"{other.name}.lock", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            shutil.rmtree(other, ignore_errors=True)
        (other.parent / f"{other.name}.lock").unlink(missing_ok=True)


def cache_dir() -> Path:
    """rollserve's cache (as ``rollserve.llm.tokens.tokenizer.cache_dir``; here without
    importing rollserve, so the script runs before it is installed)."""
    root = os.environ.get("ROLLSERVE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "rollserve"
    )
    return Path(root)


def ensure(source: Path) -> Path:
    """The venv for this checkout's verl extra and constraints, built if not yet."""
    pins = (ROOT / CONSTRAINTS).read_text()
    key = hashlib.sha256(json.dumps([sys.version_info[:2], TORCH, extra(), pins]).encode()).hexdigest()[:16]
    env_dir = cache_dir() / f"verl-venv-{key}"
    python = env_dir / "bin" / "python"
    env_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(env_dir.parent / f"verl-venv-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process building it: wait for it
        if not (env_dir / "complete").is_file():
            shutil.rmtree(env_dir, ignore_errors=True)
            started = time.monotonic()
            venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
            pip(python, "-c", str(source / CONSTRAINTS), TORCH, f"{source}[verl]", timeout=BUILD_TIMEOUT_S)
            (env_dir / "complete").write_text(f"built in {time.monotonic() - started:.0f} s\n")
            _remove_stale(env_dir)
    return env_dir


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="rollserve-verl-env-") as tmp:
        began = time.monotonic()
        print(f"verl venv ready: {ensure(source_copy(Path(tmp)))} ({time.monotonic() - began:.0f} s)")
