"""Where the host holds rollserve's bundled datasets (their gold answers), for the
bubblewrap view to hide (bwrap_view.py).

The datasets are files of the package (``rollserve/data``), but they are not the only
copy on a host that runs rollserve:

- a source checkout holds them in its work tree (``src/rollserve/data``, and the
  sources of swe-mini under ``scripts/``), in its git history (``git show
  HEAD:src/rollserve/data/code_tasks.jsonl`` reads them back from ``.git``, packed or
  not), and in what builds leave there (``build/``, ``*.egg-info``, caches);
- a repository with several work trees (``git worktree``) has a copy in each, and
  one git folder (the main work tree's ``.git``) that they all share;
- an editable install (``pip install -e``) points at a checkout (its
  ``direct_url.json``); a regular one has its own ``rollserve/data``.

So: every checkout of rollserve this host's Python knows about (the running
package's, and the source of each installed distribution), with every work tree
and the git folder of its repository, is covered as a whole (``checkouts``); the
``data`` folder of every installed copy is covered too (``answer_folders``), since
the server's own Python may be bound back into a sandbox (and with it a
site-packages that holds a copy). Git's files are read directly (``.git`` file,
``commondir``, ``worktrees/*/gitdir``): running git would need git on the host, and
as root it refuses a checkout owned by another user.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import logging
from pathlib import Path
from urllib.parse import unquote, urlparse

log = logging.getLogger(__name__)

PACKAGE = Path(__file__).resolve().parent.parent  # the running rollserve package
DIST = "rollserve"


@functools.lru_cache(maxsize=1)
def checkouts() -> tuple[Path, ...]:
    """Folders that hold a source checkout of rollserve (work trees, and a git folder
    that lives outside them), resolved, sorted."""
    found: set[Path] = set()
    for start in [PACKAGE, *_installed_sources()]:
        found.update(_checkout_of(start))
    return tuple(sorted(found))


@functools.lru_cache(maxsize=1)
def answer_folders() -> tuple[Path, ...]:
    """The ``rollserve/data`` folder of the running package and of every installed
    distribution of rollserve, resolved, sorted."""
    folders = {PACKAGE / "data"}
    for dist in _distributions():
        try:
            folders.add(Path(str(dist.locate_file("rollserve/data"))).resolve())
        except (OSError, ValueError):
            continue
    return tuple(sorted(f for f in folders if f.is_dir()))


def _distributions() -> list[importlib.metadata.Distribution]:
    try:
        return [d for d in importlib.metadata.distributions() if (d.metadata["Name"] or "").lower() == DIST]
    except Exception:  # a broken dist-info anywhere on sys.path: hide what we know
        log.exception("listing the installed distributions failed")
        return []


def _installed_sources() -> list[Path]:
    """Local folders that installed distributions of rollserve came from (editable
    installs and installs from a folder: PEP 610 ``direct_url.json``)."""
    sources = []
    for dist in _distributions():
        try:
            url = json.loads(dist.read_text("direct_url.json") or "{}").get("url", "")
        except (OSError, ValueError, AttributeError):
            continue
        parsed = urlparse(url)
        if parsed.scheme == "file" and parsed.path:
            path = Path(unquote(parsed.path))
            if path.is_dir():
                sources.append(path.resolve())
    return sources


def _checkout_of(start: Path) -> set[Path]:
    """The project folder that holds ``start`` (a folder with ``.git``, or with a
    ``pyproject.toml``, at most three levels up: ``src/rollserve``), with every work
    tree and the git folder of its repository. Empty if it is in none (site-packages)."""
    for folder in [start, *list(start.parents)[:3]]:
        if folder == Path("/"):
            break
        dot_git = folder / ".git"
        if dot_git.exists():
            return {folder, *_repository(dot_git)}
        if (folder / "pyproject.toml").is_file() and (folder / "src" / DIST).is_dir():
            return {folder}
    return set()


def _repository(dot_git: Path) -> set[Path]:
    """Every work tree of the repository that ``dot_git`` (a ``.git`` folder, or a
    linked work tree's ``.git`` file) belongs to, and its common git folder."""
    git_dir = dot_git
    if dot_git.is_file():
        text = dot_git.read_text(errors="replace").strip()
        if not text.startswith("gitdir:"):
            return set()
        git_dir = (dot_git.parent / text.removeprefix("gitdir:").strip()).resolve()
    common = git_dir
    commondir = git_dir / "commondir"
    if commondir.is_file():
        common = (git_dir / commondir.read_text(errors="replace").strip()).resolve()
    found = {common.resolve()}
    if common.name == ".git":  # not bare: the main work tree is its parent
        found.add(common.parent.resolve())
    for gitdir in (common / "worktrees").glob("*/gitdir"):
        try:
            linked = Path(gitdir.read_text(errors="replace").strip())
        except OSError:
            continue
        linked = gitdir.parent / linked  # (git may write it relative to its folder)
        if linked.parent.is_dir():
            found.add(linked.parent.resolve())
    return found
