"""The sandboxes' own Python: a venv the server makes, holding only what sandboxed
code needs, never the server's site-packages (``server_python``).

It is a venv of the server's base interpreter (``python -m venv --without-pip``: its
``python`` is a link to that interpreter, whose standard library the sandboxes see)
into whose site-packages the server copies, from its own, the distributions named in
``PACKAGES`` (or the runtime's ``python_packages``) and everything they require:

- ``ipython``: the python tool's kernel (``sandbox/tools/ipython_driver.py``), with
  ``matplotlib`` and ``pillow`` for the figures and images it returns as PNG;
- ``pytest``: the swe family's test runs and the agent's ``python -m pytest`` in host
  mode (``handlers/swe``);
- ``sympy``, ``numpy``: what the python tool is for in math (its tests compute with
  sympy);
- ``mini-swe-agent``: the swe family's harness preset (``handlers/swe/harness.py``).

The gateway's forwarder needs the standard library only. A distribution the server
does not have is left out (logged). Copies are hard links where the filesystem
allows (no space taken), else copies; files a distribution installs outside
site-packages (scripts) are left out.

Made once per interpreter and set of distributions (the folder's name is a hash of
them: an upgrade makes another), under ``<cache>/<hash>``: built in a folder of its
own and renamed into place, so servers sharing a cache never see a half-made one
(the loser of a race drops its copy). A made one is used as it is.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import stat
import sys
import tempfile
import venv
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

from rollserve.sandbox.server_python import closed_to_others

log = logging.getLogger(__name__)

PACKAGES = ("ipython", "matplotlib", "pillow", "pytest", "sympy", "numpy", "mini-swe-agent")
FORMAT = 1  # bumped when what a made prefix holds changes
MANIFEST = "rollserve-sandbox-python.json"


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _wanted(requirement: str, extras: frozenset[str]) -> tuple[str, frozenset[str]] | None:
    """(the distribution a requirement string names, the extras it asks of it), or
    None when its marker (an extra not asked for, another platform) leaves it out here."""
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        parsed = Requirement(requirement)
    except InvalidRequirement:
        return None
    marker = parsed.marker
    if marker is not None and not any(marker.evaluate({"extra": extra}) for extra in {"", *extras}):
        return None
    return parsed.name, frozenset(parsed.extras)


def closure(names: Iterable[str]) -> tuple[list[metadata.Distribution], list[str]]:
    """The installed distributions ``names`` need (themselves and their requirements,
    transitively, with the extras a requirement asks for, e.g. ``httpx[http2]``), and
    the names not installed."""
    found: dict[str, metadata.Distribution] = {}
    done: set[tuple[str, frozenset[str]]] = set()
    missing: list[str] = []
    todo: list[tuple[str, frozenset[str], bool]] = [(name, frozenset(), True) for name in names]
    while todo:
        name, extras, top = todo.pop()
        key = _canonical(name)
        if (key, extras) in done:
            continue
        done.add((key, extras))
        try:
            dist = found.get(key) or metadata.distribution(name)
        except metadata.PackageNotFoundError:
            if top:
                missing.append(name)
            continue
        found[key] = dist
        for requirement in dist.requires or []:
            wanted = _wanted(requirement, extras)
            if wanted is not None:
                todo.append((*wanted, False))
    return sorted(found.values(), key=lambda d: _canonical(d.metadata["Name"])), missing


def prefix_key(dists: list[metadata.Distribution]) -> str:
    material = json.dumps(
        [FORMAT, sys.version, str(Path(sys.base_prefix).resolve()), [(d.metadata["Name"], d.version) for d in dists]]
    )
    return hashlib.sha256(material.encode()).hexdigest()[:16]


def site_packages(prefix: Path) -> Path:
    """The site-packages of a made prefix."""
    return prefix / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"


def ensure(cache: Path, names: Iterable[str] = PACKAGES) -> Path:
    """The made prefix for ``names`` under ``cache``, made if missing (blocking: call
    it in a thread); ``OSError`` if it cannot be made."""
    dists, missing = closure(names)
    if missing:
        log.info("sandbox python: not installed here, left out: %s", ", ".join(missing))
    final = cache / prefix_key(dists)
    cache.mkdir(parents=True, exist_ok=True)
    _check_ours(cache)
    if (final / MANIFEST).is_file():
        return final
    os.chmod(cache, 0o755)  # sandboxes of a root server run as other uids
    building = cache / f".build-{final.name}-{secrets.token_hex(4)}"
    try:
        _build(building, dists)
        try:
            building.rename(final)
        except OSError:  # another server made it first (the target is not empty)
            if not (final / MANIFEST).is_file():
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    log.info("sandbox python made at %s (%d distributions)", final, len(dists))
    return final


def _build(prefix: Path, dists: list[metadata.Distribution]) -> None:
    venv.EnvBuilder(symlinks=True, with_pip=False, clear=False).create(prefix)
    target = site_packages(prefix)
    for dist in dists:
        _copy_distribution(dist, target)
    manifest = {
        "python": sys.version,
        "base_prefix": str(Path(sys.base_prefix).resolve()),
        "distributions": {d.metadata["Name"]: d.version for d in dists},
    }
    (prefix / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    # Readable and traversable by all: sandboxes of a root server run as other uids.
    # (Hard links are of files others can read already, and are left as they are.)
    for folder, subdirs, files in os.walk(prefix):
        for name in subdirs:
            os.chmod(os.path.join(folder, name), 0o755)
        for name in files:
            info = os.lstat(path := os.path.join(folder, name))
            if not os.path.islink(path) and info.st_nlink == 1:
                os.chmod(path, info.st_mode | 0o444)
    os.chmod(prefix, 0o755)


def _copy_distribution(dist: metadata.Distribution, target: Path) -> None:
    """Copy ``dist``'s installed files (those under its site-packages) into ``target``."""
    files = dist.files
    if files is None:  # no RECORD: nothing says what it installed
        log.warning("sandbox python: %s lists no files (no RECORD); left out", dist.metadata["Name"])
        return
    for file in files:
        relative = Path(str(file))
        if relative.is_absolute() or ".." in relative.parts:
            continue  # scripts and data outside site-packages
        source = Path(str(dist.locate_file(file)))
        if not source.is_file():
            continue
        destination = target / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        if destination.exists():
            continue
        if source.stat().st_mode & 0o004:  # a link shares the mode: only of readable files
            try:
                os.link(source, destination)
                continue
            except OSError:  # another filesystem, or links not allowed
                pass
        shutil.copy2(source, destination)


def _check_ours(cache: Path) -> None:
    """``OSError`` unless ``cache`` is a real folder of this server's uid that no one
    else may write (in a shared temp folder another user could have made it first)."""
    info = os.lstat(cache)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise OSError(
            f"{cache} is not a folder of uid {os.geteuid()} closed to others' writes: "
            "not used for the sandboxes' Python"
        )


def default_cache(folder_root: Path | None, other_uids: bool) -> Path:
    """Where a runtime makes the sandboxes' Python: the user's cache folder
    (``$XDG_CACHE_HOME/rollserve/sandbox-python``, else ``~/.cache/...``: one for all
    of the user's servers), or, when sandboxes run as other uids that cannot reach it
    (a root server's, /root being closed to others), ``<folder_root or the temp
    folder>/rollserve-python-<uid>``."""
    home = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    cache = Path(home) / "rollserve" / "sandbox-python"
    if not other_uids:
        return cache
    try:
        existing = next((p for p in (cache, *cache.parents) if p.exists()), Path("/"))
        if closed_to_others(existing) is None:
            return cache
    except OSError:  # (a folder on the way we may not look into)
        pass
    return Path(folder_root or tempfile.gettempdir()) / f"rollserve-python-{os.geteuid()}"


class SandboxPython:
    """A runtime's sandbox Python: made at the first ``get`` (in a thread), then kept;
    None (logged) while it cannot be made, tried again at the next ``get``."""

    def __init__(self, cache: Path, names: Iterable[str]) -> None:
        self.cache = cache
        self.names = tuple(names)
        self.prefix: Path | None = None
        self.error: str | None = None
        self._lock = asyncio.Lock()

    async def get(self) -> Path | None:
        async with self._lock:
            if self.prefix is None:
                try:
                    self.prefix = await asyncio.to_thread(ensure, self.cache, self.names)
                    self.error = None
                except OSError as error:
                    self.error = f"the sandboxes' Python could not be made under {self.cache}: {error}"
                    log.warning("%s", self.error)
            return self.prefix
