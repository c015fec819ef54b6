"""What of the server's own Python a sandbox may see: its interpreter and standard
library, never its packages.

The server's site-packages hold everything it runs with: reasoning-gym (whose
generators rebuild a task's entry and its answer from a seed), rollserve itself, the
scorers. A sandbox over the host root would see them, and a policy's code could
import them. So a sandbox sees none of:

- every site dir of the server's interpreter (``site.getsitepackages()``), of its
  base interpreter (a venv's ``python`` is a link to it, and a pyenv or conda build
  keeps packages in its own site-packages), and the user site;
- every other folder on the server's ``sys.path`` that is not its standard library
  (``.pth`` additions, ``PYTHONPATH``, Debian's dist-packages), but the script's own
  folder or the working folder (``sys.path[0]``) unless it is one of packages;
- the venv the server runs from, as a whole (its scripts name the server's python).

The base interpreter's prefix (binary and standard library) stays visible: sandboxed
Python runs on it, with packages of its own (``sandbox_python``).
"""

from __future__ import annotations

import functools
import site
import stat
import sys
import sysconfig
from pathlib import Path


def base_prefix() -> Path:
    """The base interpreter's prefix (its binary and standard library), resolved."""
    return Path(sys.base_prefix).resolve()


def server_venv() -> Path | None:
    """The venv the server runs from (resolved), or None when it runs from none."""
    return Path(sys.prefix).resolve() if sys.prefix != sys.base_prefix else None


def _stdlib() -> list[Path]:
    base = {
        "installed_base": sys.base_prefix,
        "base": sys.base_prefix,
        "installed_platbase": sys.base_exec_prefix,
        "platbase": sys.base_exec_prefix,
    }
    paths = sysconfig.get_paths(vars=base)
    return [Path(paths[key]).resolve() for key in ("stdlib", "platstdlib")]


@functools.cache
def site_dirs() -> tuple[Path, ...]:
    """Every folder of packages the server's Python reads (see the module's doc),
    resolved, outermost first; the standard library and the folders holding it are
    never among them."""
    stdlib = _stdlib()
    base = {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}
    found = [
        *site.getsitepackages(),
        site.getusersitepackages(),
        *(sysconfig.get_paths(vars=base)[key] for key in ("purelib", "platlib")),
        *(entry for entry in sys.path[1:] if entry),
    ]
    # sys.path[0] is the script's folder (or the working folder): hidden only if it is
    # a folder of packages (a venv's bin is hidden with its venv).
    if sys.path and sys.path[0] and {"site-packages", "dist-packages"} & set(Path(sys.path[0]).parts):
        found.append(sys.path[0])
    venv = server_venv()
    dirs: list[Path] = [venv] if venv is not None else []
    for entry in found:
        path = Path(entry).resolve()
        try:
            if not path.is_dir() or path == Path("/"):
                continue
        except OSError:  # under a folder this uid may not look into: nothing to hide
            continue
        # Not the standard library nor a folder above it; inside it, only its
        # site-packages (lib-dynload is the standard library's own).
        inside = [lib for lib in stdlib if lib in path.parents]
        if any(path == lib or path in lib.parents for lib in stdlib) or (
            inside and not {"site-packages", "dist-packages"} & set(path.parts)
        ):
            continue
        dirs.append(path)
    unique = sorted(set(dirs), key=lambda p: (len(p.parts), str(p)))
    return tuple(p for p in unique if not any(other in p.parents for other in unique))


def within(path: Path, folders: list[Path] | tuple[Path, ...]) -> bool:
    """Whether ``path`` is one of ``folders`` or inside one."""
    return any(folder == path or folder in path.parents for folder in folders)


def closed_to_others(path: Path) -> str | None:
    """Why a uid that is neither owner nor group could not reach ``path``, or None."""
    for folder in [*reversed(path.parents), path]:
        mode = folder.stat().st_mode
        if not mode & stat.S_IXOTH:
            return (
                f"{folder} is closed to other users (mode {stat.filemode(mode)}), and "
                "sandboxes of a root server run as a uid of their own"
            )
    return None
